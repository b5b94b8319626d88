"""FormlineLogitsProcessor against vLLM's own interfaces (``BatchUpdate``,
``MoveDirectionality``, ``SamplingParams``), driven step by step as vLLM's model runner
drives it, with the real SmolLM2 tokenizer: rows follow the batch, unconstrained rows are
untouched, placeholders wait, a refused token closes its row, ``max_tokens`` and
``max_model_len`` close a value, a shortened output is accepted again, and a tokenizer
formline cannot read fails the processor's construction (vLLM's startup)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

from formline.backends.vllm import FormlineLogitsProcessor, vllm_xargs
from formline.backends.vllm import processor as processor_module
from formline.backends.vllm.constraints import compiled_for, read_constraint
from formline.grammar.budget import CompileBudget
from formline.mask.bitmask import allocate_token_bitmask, bitmask_to_ids
from formline.mask.matcher import GrammarMatcher
from formline.vocab import VocabularyError

VOCABULARY_SIZE = 49152
MAX_MODEL_LEN = 2048
COLOURS = vllm_xargs(choice=["red", "green", "blue"])
DIGITS = vllm_xargs(regex="[0-9]{3}")


def make_processor(tokenizer: Path, vocabulary_size: int) -> FormlineLogitsProcessor:
    """A processor built as vLLM's model runner builds it, from the parts of vLLM's config
    it reads."""
    model_config = SimpleNamespace(
        tokenizer=str(tokenizer),
        tokenizer_revision=None,
        trust_remote_code=False,
        get_vocab_size=lambda: vocabulary_size,
        max_model_len=MAX_MODEL_LEN,
    )
    config = SimpleNamespace(
        model_config=model_config, scheduler_config=SimpleNamespace(max_num_seqs=8)
    )
    return FormlineLogitsProcessor(config, torch.device("cpu"), False)  # type: ignore[arg-type]


@pytest.fixture
def processor(model_directory: Path) -> FormlineLogitsProcessor:
    return make_processor(model_directory, VOCABULARY_SIZE)


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


def text_of(processor: FormlineLogitsProcessor, tokens: list[int]) -> str:
    return b"".join(processor.vocabulary.token_bytes[token] for token in tokens).decode()


def greedy(
    processor: FormlineLogitsProcessor, output: list[int], preferred: dict[int, float]
) -> int:
    """One step of a one-row batch whose model prefers ``preferred`` (token: logit): the
    token the masked logits' argmax picks, appended to ``output`` as vLLM appends it."""
    logits = torch.zeros(1, VOCABULARY_SIZE)
    for token, value in preferred.items():
        logits[0, token] = value
    processor.apply(logits)
    token = int(torch.argmax(logits[0]))
    output.append(token)
    return token


def test_a_tokenizer_formline_cannot_read_fails_at_construction(tmp_path: Path) -> None:
    # Built lazily at the first constrained request, the vocabulary's error escaped vLLM's
    # engine step: every request in the batch failed, and again at each such request.
    pieces = ["[PAD]", "[UNK]", "[SEP]", "a", "b", "##a", "1", "2", "{", "}"]
    wordpiece = Tokenizer(
        models.WordPiece({piece: index for index, piece in enumerate(pieces)}, unk_token="[UNK]")
    )
    wordpiece.pre_tokenizer = pre_tokenizers.Whitespace()
    wordpiece.decoder = decoders.WordPiece()
    PreTrainedTokenizerFast(
        tokenizer_object=wordpiece, unk_token="[UNK]", eos_token="[SEP]", pad_token="[PAD]"
    ).save_pretrained(tmp_path)
    with pytest.raises(VocabularyError, match=r"cannot read the tokenizer of .*WordPiece"):
        make_processor(tmp_path, 16)


def test_max_model_len_closes_a_value_before_vllm_cuts_it(
    processor: FormlineLogitsProcessor,
) -> None:
    # vLLM ends a request when its prompt and output reach max_model_len, whatever its
    # max_tokens (the offline LLM leaves a larger max_tokens as it is): 16 tokens here.
    schema = {"type": "array", "items": {"type": "string", "maxLength": 3}}
    prompt, output = [1] * (MAX_MODEL_LEN - 16), []
    params = SamplingParams(extra_args=vllm_xargs(json_schema=schema), max_tokens=1000)
    processor.update_state(update(1, add=[(0, params, prompt, output)]))
    looping, letters = token_of(processor, '","'), token_of(processor, "ab")
    while len(prompt) + len(output) < MAX_MODEL_LEN:
        if greedy(processor, output, {looping: 10.0, letters: 5.0}) in processor.vocabulary.eos_ids:
            output.pop()
            break
    assert isinstance(json.loads(text_of(processor, output)), list)


def test_a_closing_that_holds_a_stop_token_is_not_forced(
    processor: FormlineLogitsProcessor,
) -> None:
    # The closing of "1" is ".0", and '.' is a stop token: forced, vLLM would stop on it,
    # mid-value, and answer "stop". Unforced, no stop token is allowed inside the value.
    point = token_of(processor, ".")
    number = vllm_xargs(regex=r"[0-9]+\.[0-9]+")
    output = [token_of(processor, "1")]
    options = {"stop_token_ids": [point, 2], "max_tokens": 4}
    processor.update_state(update(1, add=[added(0, number, output, **options)]))
    logits = torch.zeros(1, VOCABULARY_SIZE)
    processor.apply(logits)
    allowed = finite_ids(logits[0])
    assert allowed and point not in allowed and not processor.rows[0].forced
    assert set(allowed) == set(allowed_ids(number, "1", processor)) - {point}


@pytest.mark.parametrize(
    "extra",
    [vllm_xargs(json_schema={"type": "number"}), vllm_xargs(regex=r"[0-9]+(\.[0-9]+)?")],
)
def test_with_one_token_left_a_value_that_may_end_ends(
    processor: FormlineLogitsProcessor, extra: dict[str, Any]
) -> None:
    # The model wants "111." in 4 tokens: its '.' would be vLLM's last token, leaving a
    # number that cannot end, answered "length".
    one, point = token_of(processor, "1"), token_of(processor, ".")
    output: list[int] = []
    options = {"stop_token_ids": [2], "max_tokens": 4}
    processor.update_state(update(1, add=[added(0, extra, output, **options)]))
    for preferred in (one, one, one, point):
        if greedy(processor, output, {preferred: 10.0}) == 2:
            break
    assert output == [one, one, one, 2]


def test_a_shortened_output_is_accepted_again_from_its_start(
    processor: FormlineLogitsProcessor, caplog: pytest.LogCaptureFixture
) -> None:
    # vLLM's V1 runner shortens a request's output_token_ids in place, with no batch update,
    # when it discards tokens (a failed KV load): position 0 is sampled again.
    pair = vllm_xargs(regex="[0-9][a-z]")
    output = [token_of(processor, "1")]
    processor.update_state(update(1, add=[added(0, pair, output, max_tokens=50)]))
    processor.apply(torch.zeros(1, VOCABULARY_SIZE))  # accepts "1"
    del output[:]
    logits = torch.zeros(1, VOCABULARY_SIZE)
    with caplog.at_level(logging.WARNING, logger="formline.vllm"):
        processor.apply(logits)
    assert finite_ids(logits[0]) == allowed_ids(pair, "", processor)
    assert "shortened" in caplog.text
    output.append(token_of(processor, "2"))
    logits = torch.zeros(1, VOCABULARY_SIZE)
    processor.apply(logits)
    assert finite_ids(logits[0]) == allowed_ids(pair, "2", processor)


def test_an_output_token_replaced_in_place_is_accepted_again(
    processor: FormlineLogitsProcessor,
) -> None:
    # One token dropped and another appended between two steps: the length is the same,
    # and the matcher kept the token that was gone.
    pair = vllm_xargs(regex="1a|2b")
    output = [token_of(processor, "1")]
    processor.update_state(update(1, add=[added(0, pair, output, max_tokens=50)]))
    processor.apply(torch.zeros(1, VOCABULARY_SIZE))  # accepts "1"
    output[0] = token_of(processor, "2")
    logits = torch.zeros(1, VOCABULARY_SIZE)
    processor.apply(logits)
    assert finite_ids(logits[0]) == allowed_ids(pair, "2", processor)


def test_validate_params_refuses_token_filters_that_can_empty_the_mask() -> None:
    # vLLM removes these tokens before formline's mask: where the grammar allows only
    # removed ones, nothing is left, and vLLM samples one anyway (a broken value, "stop").
    for options, message in (
        ({"bad_words": ["1"]}, "bad_words"),
        ({"allowed_token_ids": [5]}, "allowed_token_ids"),
    ):
        with pytest.raises(ValueError, match=message):
            FormlineLogitsProcessor.validate_params(SamplingParams(extra_args=DIGITS, **options))
        FormlineLogitsProcessor.validate_params(SamplingParams(**options))  # unconstrained
