"""The runner on a scripted backend: parse flags, coercion, validity, scores, repair."""

from __future__ import annotations

from typing import Any

import pytest

from formline.evaluation.dataset import extraction_dev_directory
from formline.evaluation.runner import load_tasks, run_task, summarize_variant
from formline.evaluation.variants import VARIANTS
from formline.vocab import Vocabulary
from scripted import ScriptedDecoder, install_decoder

EXTRACTION = extraction_dev_directory()
RIGHT = '{"name":"Chiamaka Eze","age":29,"city":"Lagos"}'


@pytest.fixture
def scripted(smollm2_vocab: Vocabulary, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A scripted model and loop: each call of ``formline.generate`` writes the next text."""

    def make(*texts: str) -> ScriptedDecoder:
        decoder = ScriptedDecoder(
            smollm2_vocab, *texts, forward_seconds=0.1, mask_seconds=0.002, completion_tokens=12
        )
        return install_decoder(monkeypatch, decoder)

    return make


@pytest.fixture
def person() -> dict[str, Any]:
    return load_tasks(EXTRACTION / "tasks.jsonl", limit=1)[0]


def test_free_output_in_a_fence_parses_leniently(scripted: Any, person: Any) -> None:
    backend = scripted(f"```json\n{RIGHT}\n```")
    record = run_task(person, VARIANTS["free"], backend, 50)
    assert (record["strict"], record["lenient"], record["valid"]) == (False, True, True)
    assert record["scores"] == {"name": True, "age": True, "city": True}
    assert "JSON Schema" in backend.prompts[0]  # free describes the schema


def test_string_typed_answer_is_coerced_then_scored(scripted: Any, person: Any) -> None:
    backend = scripted(RIGHT.replace("29", '"29"'))
    record = run_task(person, VARIANTS["string-typed"], backend, 50)
    assert record["value"]["age"] == 29 and record["valid"] and record["scores"]["age"]
    masked = scripted(RIGHT)
    constrained = run_task(person, VARIANTS["constrained"], masked, 50)
    assert "JSON Schema" not in masked.prompts[0]  # the mask alone: the schema not described
    summary = summarize_variant([person], [constrained])
    assert summary["fields_correct"] == 1.0 and summary["mask_ms_per_token"] == pytest.approx(
        2 / 12
    )


def test_repair_retries_an_invalid_answer(scripted: Any, person: Any) -> None:
    wrong = '{"name":"Chiamaka Eze","age":-1,"city":"Lagos","extra":1}'
    backend = scripted(wrong, RIGHT)
    record = run_task(person, VARIANTS["repair"], backend, 50)
    assert record["attempts"] == 2 and record["tokens"] == 24
    assert record["output"] == RIGHT and all(record["scores"].values())
    summary = summarize_variant([person], [record])
    assert summary["attempts_per_task"] == 2 and "mask_ms_per_token" not in summary
