"""FormlineLogitsProcessor against vLLM's own interfaces (``BatchUpdate``,
``MoveDirectionality``, ``SamplingParams``), driven step by step as vLLM's model runner
drives it, with the real SmolLM2 tokenizer: rows follow the batch, unconstrained rows are
untouched, placeholders wait, a refused token closes its row, ``max_tokens`` closes a value."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

from formline.backends.vllm import FormlineLogitsProcessor, vllm_xargs
from formline.backends.vllm import processor as processor_module
from formline.backends.vllm.constraints import compiled_for, read_constraint
from formline.grammar.budget import CompileBudget
from formline.mask.bitmask import allocate_token_bitmask, bitmask_to_ids
from formline.mask.matcher import GrammarMatcher

VOCABULARY_SIZE = 49152
COLOURS = vllm_xargs(choice=["red", "green", "blue"])
DIGITS = vllm_xargs(regex="[0-9]{3}")


@pytest.fixture
def processor(model_directory: Path) -> FormlineLogitsProcessor:
    model_config = SimpleNamespace(
        tokenizer=str(model_directory),
        tokenizer_revision=None,
        trust_remote_code=False,
        get_vocab_size=lambda: VOCABULARY_SIZE,
    )
    config = SimpleNamespace(
        model_config=model_config, scheduler_config=SimpleNamespace(max_num_seqs=8)
    )
    return FormlineLogitsProcessor(config, torch.device("cpu"), False)  # type: ignore[arg-type]


def added(index: int, extra: dict[str, Any] | None, output: list[int], **options: Any) -> Any:
    return (index, SamplingParams(extra_args=extra, **options), [1, 2, 3], output)


def update(size: int, removed: Any = (), add: Any = (), moved: Any = ()) -> BatchUpdate:
    return BatchUpdate(batch_size=size, removed=list(removed), added=list(add), moved=list(moved))


def allowed_ids(extra: dict[str, Any], prefix: str, processor: FormlineLogitsProcessor) -> Any:
    """The tokens a fresh matcher of ``extra`` allows after ``prefix`` (the reference)."""
    constraint = read_constraint(extra)
    assert constraint is not None
    matcher = GrammarMatcher(compiled_for(constraint, processor.vocabulary))
    assert matcher.accept_string(prefix)
    bitmask = allocate_token_bitmask(1, VOCABULARY_SIZE)
    matcher.fill_next_token_bitmask(bitmask)
    return bitmask_to_ids(bitmask[0], VOCABULARY_SIZE).tolist()


def finite_ids(row: torch.Tensor) -> list[int]:
    return torch.isfinite(row).nonzero().flatten().tolist()


def token_of(processor: FormlineLogitsProcessor, text: str) -> int:
    assert processor.vocabulary is not None  # loads the tokenizer with it
    ids = processor._tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == 1, (text, ids)
    return int(ids[0])


def test_only_constrained_rows_are_masked(processor: FormlineLogitsProcessor) -> None:
    outputs: list[list[int]] = [[], [], []]
    batch = [added(0, COLOURS, outputs[0]), added(1, None, outputs[1])]
    batch.append(added(2, DIGITS, outputs[2]))
    processor.update_state(update(3, add=batch))
    logits = torch.randn(3, VOCABULARY_SIZE)
    original = logits.clone()
    processor.apply(logits)
    assert torch.equal(logits[1], original[1])  # the unconstrained row, bit for bit
    assert finite_ids(logits[0]) == allowed_ids(COLOURS, "", processor)
    assert finite_ids(logits[2]) == allowed_ids(DIGITS, "", processor)
    kept = torch.isfinite(logits[0])
    assert torch.equal(logits[0][kept], original[0][kept])  # allowed logits unchanged


def test_rows_follow_accepted_tokens_moves_and_removals(
    processor: FormlineLogitsProcessor,
) -> None:
    colours, digits = [token_of(processor, "gre")], [token_of(processor, "4")]
    processor.update_state(update(2, add=[added(0, COLOURS, colours), added(1, DIGITS, digits)]))
    swap = (0, 1, MoveDirectionality.SWAP)
    processor.update_state(update(2, moved=[swap]))
    logits = torch.zeros(2, VOCABULARY_SIZE)
    processor.apply(logits)
    assert finite_ids(logits[1]) == allowed_ids(COLOURS, "gre", processor)
    assert finite_ids(logits[0]) == allowed_ids(DIGITS, "4", processor)
    processor.update_state(
        update(1, removed=[0], moved=[(1, 0, MoveDirectionality.UNIDIRECTIONAL)])
    )
    colours.append(token_of(processor, "en"))  # vLLM appends to the request's own list
    logits = torch.zeros(1, VOCABULARY_SIZE)
    processor.apply(logits)
    assert finite_ids(logits[0]) == sorted(processor.vocabulary.eos_ids)
    assert set(processor.rows) == {0}


def test_a_complete_value_ends_on_the_requests_own_stop_token(
    processor: FormlineLogitsProcessor,
) -> None:
    """SmolLM2's tokenizer ends on 0, 2 and 4 (<reponame>, a stop to llama.cpp); vLLM stops
    this request on 2 only."""
    output = [token_of(processor, "red")]
    processor.update_state(update(1, add=[added(0, COLOURS, output, stop_token_ids=[2])]))
    assert processor.vocabulary.eos_ids == {0, 2, 4}
    logits = torch.zeros(1, VOCABULARY_SIZE)
    processor.apply(logits)
    assert finite_ids(logits[0]) == [2]
    output.append(2)  # the stop token: vLLM ends the request, the matcher is not asked
    processor.apply(torch.zeros(1, VOCABULARY_SIZE))
    assert not processor.rows[0].closed


def test_a_stop_token_is_never_the_grammars_text(processor: FormlineLogitsProcessor) -> None:
    # vLLM ends the request on a stop token: a '.' among them cut [0-9]+\.[0-9]+ to "18".
    point = token_of(processor, ".")
    number = vllm_xargs(regex=r"[0-9]+\.[0-9]+")
    output = [token_of(processor, "1")]
    processor.update_state(update(1, add=[added(0, number, output, stop_token_ids=[point, 2])]))
    logits = torch.zeros(1, VOCABULARY_SIZE)
    processor.apply(logits)
    allowed = finite_ids(logits[0])
    assert point not in allowed and set(allowed) < set(allowed_ids(number, "1", processor))
    assert point in allowed_ids(number, "1", processor)  # the grammar's text, without it
    # Every token the grammar allows here is a stop token: the row ends, not a NaN draw.
    only_point = vllm_xargs(regex=r"1\.")
    processor.update_state(update(2, add=[added(1, only_point, [token_of(processor, "1")],
                                                stop_token_ids=[point, 2])]))  # fmt: skip
    logits = torch.zeros(2, VOCABULARY_SIZE)
    processor.apply(logits)
    assert processor.rows[1].closed and finite_ids(logits[1]) == [2, point]


def test_a_placeholder_waits_for_its_real_token(processor: FormlineLogitsProcessor) -> None:
    output = [-1]  # async scheduling: the sampled id is not on the CPU yet
    processor.update_state(update(1, add=[added(0, DIGITS, output)]))
    logits = torch.zeros(1, VOCABULARY_SIZE)
    processor.apply(logits)
    assert finite_ids(logits[0]) == allowed_ids(DIGITS, "", processor)
    output[0] = token_of(processor, "7")
    logits = torch.zeros(1, VOCABULARY_SIZE)
    processor.apply(logits)
    assert finite_ids(logits[0]) == allowed_ids(DIGITS, "7", processor)


def test_a_refused_token_closes_its_row_without_failing_the_batch(
    processor: FormlineLogitsProcessor, caplog: pytest.LogCaptureFixture
) -> None:
    output = [token_of(processor, "x")]  # not a digit: another processor broke the mask
    processor.update_state(update(1, add=[added(0, DIGITS, output)]))
    logits = torch.zeros(1, VOCABULARY_SIZE)
    with caplog.at_level(logging.ERROR, logger="formline.vllm"):
        processor.apply(logits)
    assert finite_ids(logits[0]) == sorted(processor.vocabulary.eos_ids)
    assert "refused sampled token" in caplog.text


def test_max_tokens_closes_a_value_the_model_keeps_extending(
    processor: FormlineLogitsProcessor,
) -> None:
    schema = {"type": "array", "items": {"type": "string", "maxLength": 3}}
    output: list[int] = []
    processor.update_state(
        update(1, add=[added(0, vllm_xargs(json_schema=schema), output, max_tokens=16)])
    )
    looping = token_of(processor, '","')  # what a looping model prefers, step after step
    for _ in range(16):
        logits = torch.zeros(1, VOCABULARY_SIZE)
        logits[0, looping] = 10.0
        logits[0, token_of(processor, "ab")] = 5.0
        processor.apply(logits)
        token = int(torch.argmax(logits[0]))
        if token in processor.vocabulary.eos_ids:
            break
        output.append(token)
    text = b"".join(processor.vocabulary.token_bytes[t] for t in output).decode()
    value = json.loads(text)  # complete within max_tokens, not cut off
    assert isinstance(value, list) and len(output) <= 16


def test_validate_params_refuses_what_does_not_compile() -> None:
    FormlineLogitsProcessor.validate_params(SamplingParams(extra_args=DIGITS))
    FormlineLogitsProcessor.validate_params(SamplingParams())
    with pytest.raises(ValueError, match="formline_regex does not compile"):
        FormlineLogitsProcessor.validate_params(SamplingParams(extra_args={"formline_regex": "(("}))
    with pytest.raises(ValueError, match="left recursion"):  # found by the automaton's build
        FormlineLogitsProcessor.validate_params(
            SamplingParams(extra_args=vllm_xargs(grammar='root ::= root "a" | "a"'))
        )


def test_validate_params_refuses_what_would_cut_a_constrained_output() -> None:
    for options, message in (({"stop": ["}"]}, "stop strings"), ({"min_tokens": 2}, "min_tokens")):
        with pytest.raises(ValueError, match=message):
            FormlineLogitsProcessor.validate_params(SamplingParams(extra_args=DIGITS, **options))
        FormlineLogitsProcessor.validate_params(SamplingParams(**options))  # unconstrained


def test_a_limit_met_while_decoding_ends_its_request_only(
    processor: FormlineLogitsProcessor,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # After "000" the first mask walks the letters into more DFA states than a budget of
    # 100 allows (0{3}[a-z]*a[a-z]{20} can need 2^21): raised out of apply, it would stop
    # vLLM's engine and every request in it.
    def compiled_with_small_budget(constraint: Any, vocabulary: Any) -> Any:
        return constraint.compile(vocabulary, budget=CompileBudget(dfa_states=100)).compiled

    monkeypatch.setattr(processor_module, "compiled_for", compiled_with_small_budget)
    blowup = vllm_xargs(regex="0{3}[a-z]*a[a-z]{20}")
    zeros = [token_of(processor, "0")] * 3
    processor.update_state(update(2, add=[added(0, blowup, zeros), added(1, DIGITS, [])]))
    logits = torch.zeros(2, VOCABULARY_SIZE)
    with caplog.at_level(logging.ERROR, logger="formline.vllm"):
        processor.apply(logits)
    assert finite_ids(logits[0]) == sorted(processor.vocabulary.eos_ids)
    assert finite_ids(logits[1]) == allowed_ids(DIGITS, "", processor)  # the other row masked
    assert "AutomatonLimitError" in caplog.text and processor.rows[0].closed


def test_the_stats_file_records_steps(processor: FormlineLogitsProcessor, tmp_path: Path) -> None:
    processor._stats_path = str(tmp_path / "stats.json")
    processor.update_state(update(1, add=[added(0, DIGITS, [])]))
    processor.apply(torch.zeros(1, VOCABULARY_SIZE))
    processor._write_stats()
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["steps"] == 1 and stats["rows"] == 1 and stats["seconds"] > 0
    assert np.isfinite(stats["seconds"])


def test_a_compile_that_fails_in_the_engine_ends_its_request_on_its_stop_token(
    processor: FormlineLogitsProcessor,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # validate_params compiled it in the API process; were the engine's compile to fail
    # (a time limit under load), raising out of update_state would stop the engine.
    def failing(constraint: Any, vocabulary: Any) -> Any:
        raise ValueError("vllm_xargs.formline_regex does not compile: past its time limit")

    monkeypatch.setattr(processor_module, "compiled_for", failing)
    with caplog.at_level(logging.ERROR, logger="formline.vllm"):
        processor.update_state(update(1, add=[added(0, DIGITS, [], stop_token_ids=[2])]))
    logits = torch.zeros(1, VOCABULARY_SIZE)
    processor.apply(logits)
    assert finite_ids(logits[0]) == [2]  # vLLM stops this request on 2, not on 0
    assert "past its time limit" in caplog.text and processor.rows[0].closed
