"""Values narrowed to the source (formline.pipeline.verbatim): the spans and numbers of the
text, where a subschema is plain, and never a schema made unsatisfiable."""

from __future__ import annotations

import json
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from pydantic import BaseModel

from formline.pipeline.generate import generate
from formline.pipeline.verbatim import source_numbers, source_spans, verbatim_schema
from scripted import ScriptedEngine

SOURCE = "Lagos resident Chiamaka Eze, 29, marked her birthday with a dozen friends."
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 18},
        "city": {"type": "string", "maxLength": 5},
        "email": {"type": "string", "format": "email"},
        "tier": {"type": "string", "enum": ["gold", "silver"]},
        "score": {"type": ["number", "null"]},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age"],
}


class Person(BaseModel):
    name: str
    age: int


def test_spans_are_word_runs_without_their_edge_punctuation() -> None:
    spans = source_spans("Mateus Carvalho, 34, a fruit seller (Porto Alegre).", max_words=3)
    assert "Mateus Carvalho" in spans  # the comma after it is not part of the name
    assert "Porto Alegre" in spans
    assert "34" in spans and "Carvalho, 34" in spans  # inner punctuation stays
    assert "Mateus Alegre" not in spans  # runs only: words next to each other
    assert len(spans) == len(set(spans))
    assert source_spans("") == []


def test_numbers_are_read_from_digits_and_words() -> None:
    assert set(source_numbers(SOURCE)) >= {29, 12}


def test_plain_values_are_narrowed_and_the_rest_kept() -> None:
    narrowed = verbatim_schema(PERSON, SOURCE)
    properties = narrowed["properties"]
    assert "Chiamaka Eze" in properties["name"]["enum"]
    assert properties["age"]["enum"] == [29]  # 12 is under the minimum
    assert all(len(span) <= 5 for span in properties["city"]["enum"])
    assert "Lagos" in properties["city"]["enum"]
    assert properties["email"] == PERSON["properties"]["email"]  # format: left free
    assert properties["tier"] == PERSON["properties"]["tier"]
    assert properties["score"]["enum"][-1] is None  # nullable stays nullable
    assert 29 in properties["score"]["enum"]
    assert properties["active"] == {"type": "boolean"}
    assert PERSON["properties"]["name"] == {"type": "string"}  # the input is unchanged
    validator = Draft202012Validator(narrowed)
    assert validator.is_valid({"name": "Chiamaka Eze", "age": 29})
    assert not validator.is_valid({"name": "Ada", "age": 29})
    assert not validator.is_valid({"name": "Chiamaka Eze", "age": 23})


def test_a_subschema_with_no_candidate_is_left_as_it_was() -> None:
    schema = {"type": "object", "properties": {"age": {"type": "integer", "minimum": 100}}}
    assert verbatim_schema(schema, SOURCE) == schema  # 29 and 12 are both under 100
    assert verbatim_schema(schema, "no numbers here") == schema
    assert verbatim_schema(True, SOURCE) is True


def test_generate_writes_only_what_the_prompt_says(llama_backend: Any) -> None:
    # The model "wants" an invented age; narrowed, the only integer the text states is 29.
    engine = ScriptedEngine(llama_backend, '{"name":"Chiamaka Eze","age":23}')
    result = generate(SOURCE, Person, engine, max_tokens=40, verbatim=True, whitespace=None)
    assert result.value == Person(name="Chiamaka Eze", age=29)
    assert json.loads(result.text)["age"] == 29  # 29 or 29.0: equal in JSON Schema
    engine = ScriptedEngine(llama_backend, '{"name":"Chiamaka Eze","age":23}')
    free = generate(SOURCE, Person, engine, max_tokens=40, whitespace=None)
    assert free.value.age == 23  # without it, the invented number


@pytest.mark.parametrize("source", ["", "Ada wrote the notes."])
def test_generate_without_candidates_still_answers(llama_backend: Any, source: str) -> None:
    engine = ScriptedEngine(llama_backend, '{"name":"Ada","age":36}')
    result = generate(source, Person, engine, max_tokens=40, verbatim=True, whitespace=None)
    assert result.value.age == 36  # no number in the text: the integer is left free
