"""Values narrowed to the source (formline.pipeline.verbatim): the spans and numbers of the
text, where a subschema is plain, and never a schema made unsatisfiable."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from pydantic import BaseModel

from formline.pipeline.generate import generate
from formline.pipeline.verbatim import (
    narrows_strings,
    source_numbers,
    source_spans,
    verbatim_schema,
)
from formline.schema import compile_schema
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
    assert "bruna.s_2231" in source_spans("[uid=bruna.s_2231] Can I still use it?")
    assert "70921" in source_spans("(id:70921)")


def test_numbers_are_read_from_digits_and_words() -> None:
    assert set(source_numbers(SOURCE)) >= {29, 12}


def test_a_negative_number_the_text_states_can_be_written(smollm2_vocab: Any) -> None:
    # Magnitudes only, the low of -7 was narrowed to [7, 12]: the mask refused -7.
    text = "Low of -7 C, high 12; balance −250.50, minus 3 fees. 2020-2021, COVID-19."
    numbers = source_numbers(text)
    assert {-7, Decimal("-250.50"), -3} <= set(numbers) and {7, 12, 2020, 2021, 19} <= set(numbers)
    assert -2021 not in numbers and -19 not in numbers  # a dash inside a word is no sign
    spelled = source_numbers("A low of minus seven, negative twenty-one, minus the fee of 5.")
    assert {-7, -21} <= set(spelled) and -5 not in spelled
    schema = {"type": "object", "properties": {"low": {"type": "integer"}}}
    narrowed = verbatim_schema(schema, text)
    matcher = compile_schema(narrowed, smollm2_vocab, disk_cache=False).matcher()
    assert matcher.accept_string('{"low":-7}') and matcher.can_end()


def test_a_long_digit_table_is_no_candidate() -> None:
    # 2,000 space-grouped "123"s read as one 6,000-digit number: an enum the compiler refused
    # (past 4,000 digits), so extract() failed on a schema the user never wrote.
    numbers = source_numbers("123 " * 2000 + "and 1" + "0" * 99)
    assert numbers == [123, 10**99]


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


def test_a_number_the_schemas_step_refuses_is_no_candidate(smollm2_vocab: Any) -> None:
    # Narrowed to [3, 7], a multipleOf 5 left no value: a valid schema made unsatisfiable
    # (or, nullable, only null).
    step = {"type": "object", "properties": {"qty": {"type": "integer", "multipleOf": 5}}}
    assert verbatim_schema(step, "3 boxes of 7") == step
    narrowed = verbatim_schema(step, "3 boxes of 10, 2.5 kg")["properties"]["qty"]
    assert narrowed["enum"] == [10]
    half = {"type": "object", "properties": {"kg": {"type": ["number", "null"], "multipleOf": 0.5}}}
    assert verbatim_schema(half, "3 boxes of 10, 2.5 kg")["properties"]["kg"]["enum"] == [
        3, 10, 2.5, None,
    ]  # fmt: skip
    # As the compiler and the after-check judge a step: exactly (jsonschema's float division
    # refused 0.3 under 0.1, and 19.99 under 0.01), and without failing on a long number.
    tenth = {"type": "object", "properties": {"p": {"type": "number", "multipleOf": 0.1}}}
    narrowed = verbatim_schema(tenth, "0.3 or 0.55, ids 120 340 560 780 910 230 450 670 890 110")
    kept = narrowed["properties"]["p"]["enum"]
    assert 0.3 in kept and 0.55 not in kept and 120340560780910230450670890110 in kept
    compiled = compile_schema(narrowed, smollm2_vocab, disk_cache=False)
    assert compiled.matcher().accept_string('{"p":0.3}')  # the compiler kept what it kept
    assert compiled.check({"p": 0.3}) == []
    huge = "1" + "0" * 330 + " and 2.5"
    assert verbatim_schema(tenth, huge)["properties"]["p"]["enum"] == [2.5]


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


def test_a_date_is_narrowed_to_the_dates_the_text_states() -> None:
    schema = {
        "type": "object",
        "properties": {
            "start": {"type": "string", "format": "date"},
            "end": {"type": ["string", "null"], "format": "date"},
            "written": {"type": "string", "format": "date", "pattern": "^[0-9/]+$"},
            "stamp": {"type": "string", "format": "date-time"},
        },
    }
    text = "The lease begins on 15/08/2024 (DD/MM/YYYY) and ends on the first of June 2026."
    properties = verbatim_schema(schema, text)["properties"]
    assert properties["start"]["enum"] == ["2024-08-15", "2026-06-01"]
    assert properties["end"]["enum"] == ["2024-08-15", "2026-06-01", None]
    assert properties["written"] == schema["properties"]["written"]  # its own spelling
    assert properties["stamp"] == schema["properties"]["stamp"]
    assert verbatim_schema(schema, "no date here") == schema


def test_a_rating_scale_is_a_judgement_and_stays_free() -> None:
    schema = {
        "type": "object",
        "properties": {
            "rating": {"type": "integer", "minimum": 1, "maximum": 10},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
        },
    }
    properties = verbatim_schema(schema, "Ana, 34, has 6 years of Python.")["properties"]
    assert properties["rating"] == schema["properties"]["rating"]  # 6 is a count, not a rating
    assert properties["age"]["enum"] == [34, 6]


def test_confidence_of_copied_values_reads_their_shape(llama_backend: Any) -> None:
    # Every value is a span of the text, so whether it is found there tells nothing; a span
    # that runs across a clause break is not one value.
    script = '{"name":"Chiamaka Eze, 29, marked her birthday","age":29}'
    engine = ScriptedEngine(llama_backend, script)
    result = generate(SOURCE, Person, engine, max_tokens=60, verbatim=True, whitespace=None)
    assert result.verbatim and result.data["name"] == "Chiamaka Eze, 29, marked her birthday"
    assert result.confidence["name"] == 0.0
    assert result.confidence["age"] == pytest.approx(result.model_confidence["age"])
    assert result.model_confidence["name"] > 0.9  # the scripted model was sure of it


def test_a_source_too_long_to_narrow_strings_leaves_them_free(llama_backend: Any) -> None:
    # Cut at 4,000 spans the enum held only the shorter ones: "Maria Oliveira", near the end
    # of 2,500 words, could not be written, and another span passed every check.
    filler = " ".join(f"word{index}" for index in range(2_500))
    source = f"{filler} The buyer is Maria Oliveira, aged 41."
    schema = {
        "type": "object",
        "properties": {"buyer": {"type": "string"}, "age": {"type": "integer"}},
    }
    assert not narrows_strings(source) and narrows_strings(SOURCE)
    properties = verbatim_schema(schema, source)["properties"]
    assert properties["buyer"] == {"type": "string"}  # free: grounding checks it after
    assert 41 in properties["age"]["enum"]  # numbers are still narrowed
    answer = '{"buyer":"Maria Oliveira","age":41}'
    engine = ScriptedEngine(llama_backend, answer)
    result = generate(
        "The buyer?", schema, engine, verbatim=True, source=source, describe_schema=False
    )
    assert result.data == {"buyer": "Maria Oliveira", "age": 41}
    assert result.verbatim is False  # the confidence reads the grounded share again
    assert result.confidence["buyer"] > 0.7
