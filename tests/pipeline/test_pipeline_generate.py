"""``formline.generate`` with the real embedded model on the 72 extraction-dev tasks.

Every constrained output must parse and validate against its schema (format checks on):
72 of 72. The free outputs' parse rate is recorded by ``python -m bench.generate_bench``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from formline.backends import load_backend
from formline.constraint import Choice, Regex
from formline.evaluation.dataset import extraction_dev_directory
from formline.pipeline.generate import TruncatedOutput, generate
from formline.schema import compile_schema

EXTRACTION = extraction_dev_directory()


def tasks() -> list[dict[str, Any]]:
    lines = (EXTRACTION / "tasks.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def schema_for(task: dict[str, Any]) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((EXTRACTION / "schemas" / task["schema"]).read_text())
    return loaded


@pytest.fixture(scope="module")
def llama() -> Any:
    return load_backend("llama_cpp", n_threads=1)


@pytest.fixture(scope="module")
def transformers_backend() -> Any:
    return load_backend("transformers", threads=1)


@pytest.mark.parametrize("backend_name", ["llama", "transformers_backend"])
def test_every_constrained_extraction_parses_and_validates(
    backend_name: str, request: pytest.FixtureRequest
) -> None:
    backend = request.getfixturevalue(backend_name)
    all_tasks = tasks()
    assert len(all_tasks) == 72
    failures = []
    for task in all_tasks:
        schema = schema_for(task)
        prompt = f"{task['instruction']}\n\n{task['text']}"
        result = generate(prompt, schema, backend, max_tokens=200)
        checker = compile_schema(schema, backend.vocabulary)
        # A looping answer the budget's closing policy ended is reported as cut off
        # ("length", its .value raises) but is still complete and valid.
        ended = result.finish_reason == "stop" or result.usage["closing_tokens"] > 0
        if not ended or checker.check(json.loads(result.text)):
            failures.append((task["id"], result.finish_reason, result.text))
    assert not failures, failures


def test_truncated_output_never_pretends_to_be_a_value(llama: Any) -> None:
    schema = schema_for(tasks()[0])
    result = generate("Extract the person: Ada, 36, London.", schema, llama, max_tokens=4)
    assert result.finish_reason == "length"
    with pytest.raises(TruncatedOutput) as caught:
        _ = result.value
    assert caught.value.text == result.text


def test_regex_and_choice_outputs_match(llama: Any) -> None:
    date = generate(
        "When did Apollo 11 land? Give the date.", Regex(r"[0-9]{4}-[0-9]{2}-[0-9]{2}"), llama
    )
    assert len(date.value) == 10 and date.value[4] == "-"
    answer = generate("Is water wet? Answer yes or no.", Choice(["yes", "no"]), llama)
    assert answer.value in ("yes", "no")
