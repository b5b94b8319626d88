"""The runner on a scripted backend: parse flags, coercion, validity, scores, repair."""

from __future__ import annotations

import json
from typing import Any

import pytest

from formline.evaluation.dataset import extraction_dev_directory
from formline.evaluation.runner import load_tasks, run_all, run_task, summarize_variant
from formline.evaluation.variants import VARIANTS
from formline.pipeline.extract import DEFAULT_INSTRUCTION
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


def test_a_repair_that_ends_failed_scores_as_no_answer(scripted: Any, person: Any) -> None:
    # Three cut-off attempts end the loop at the token cap: the caller gets a Failed, no
    # value, so the task scores as none, whatever the last rejected text held.
    cut = [RIGHT.replace("29", "30"), RIGHT.replace("29", "31"), RIGHT]  # each new, the last right
    backend = scripted(*[(text, "length") for text in cut])
    record = run_task(person, VARIANTS["extract"], backend, 50)
    assert record["failed"] == "truncated at the token cap" and record["attempts"] == 3
    assert record["value"] is None and not record["valid"]
    assert not any(record["scores"].values())
    assert f"<user>\n{DEFAULT_INSTRUCTION}\n" in backend.prompts[0]  # extract's own instruction
    summary = summarize_variant([person], [record])
    assert summary["failed"] == 1 and summary["fields_correct"] == 0.0


def test_a_rerun_reuses_only_records_made_in_its_setting(
    scripted: Any, person: Any, tmp_path: Any
) -> None:
    records = tmp_path / "records.jsonl"
    variants = [VARIANTS["constrained"]]
    first = scripted(RIGHT)
    run_all([person], variants, first, 50, False, records, "model-a on llama_cpp")
    again = scripted()  # no text scripted: a decode would fail
    run_all([person], variants, again, 50, False, records, "model-a on llama_cpp")
    assert again.prompts == []  # resumed from the record
    with records.open("a") as sink:
        sink.write('{"id": "person-01", "variant": "constr')  # a run killed while writing
    other = scripted(RIGHT.replace("29", "30"))
    (found,) = run_all([person], variants, other, 50, False, records, "model-b on llama_cpp")[
        "constrained"
    ]
    assert len(other.prompts) == 1 and found["value"]["age"] == 30  # another model: decoded
    lines = records.read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(line)["id"] == person["id"] for line in lines)


def test_a_bad_task_file_is_named_before_a_model_loads(tmp_path: Any) -> None:
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "bad.json").write_text("{not json")
    task = {"id": "t1", "type": "person", "schema": "bad.json", "instruction": "", "text": ""}
    tasks = tmp_path / "tasks.jsonl"
    for lines, message in (
        ([json.dumps({**task, "gold": {}}), "{oops"], "tasks.jsonl:2: not a JSON line"),
        ([json.dumps(task)], "tasks.jsonl:1: the task has no gold"),
        ([json.dumps({**task, "type": "recipe", "gold": {}})], "no scoring rules for type"),
        ([json.dumps({**task, "gold": {}})], "task 't1': its schema"),
    ):
        tasks.write_text("\n".join(lines) + "\n")
        with pytest.raises(ValueError, match=message):
            load_tasks(tasks)
