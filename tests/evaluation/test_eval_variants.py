"""The variant builders: string-typed schemas and coercion back, field reordering, the
one-shot example, and the variant list."""

from __future__ import annotations

import json
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from formline.evaluation.dataset import extraction_dev_directory
from formline.evaluation.variants import (
    DEFAULT_VARIANTS,
    VARIANTS,
    coerce_numbers,
    example_instance,
    is_evidence_field,
    parse_variants,
    reorder_properties,
    string_typed_schema,
    to_number,
)

EXTRACTION = extraction_dev_directory()
SCHEMAS = ("person", "contract", "ticket", "invoice", "candidate", "router")


def load_schema(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((EXTRACTION / "schemas" / f"{name}.json").read_text())
    return loaded


def valid(schema: dict[str, Any], value: Any) -> bool:
    checker = Draft202012Validator.FORMAT_CHECKER
    return bool(Draft202012Validator(schema, format_checker=checker).is_valid(value))


def test_string_typed_schema_retypes_every_number_and_drops_bounds() -> None:
    invoice = load_schema("invoice")
    before = json.dumps(invoice)
    typed = string_typed_schema(invoice)
    item = typed["properties"]["items"]["items"]["properties"]
    assert item["quantity"] == {"type": "string", "description": "Number of units."}
    assert item["unit_price"]["type"] == "string" and "minimum" not in item["unit_price"]
    assert typed["properties"]["total"]["type"] == "string"
    assert typed["properties"]["currency"] == invoice["properties"]["currency"]
    assert json.dumps(invoice) == before  # the input is unchanged
    notice = string_typed_schema(load_schema("contract"))["properties"]["notice_days"]
    assert notice["type"] == ["string", "null"]


def test_coerce_numbers_turns_string_typed_answers_back() -> None:
    invoice = load_schema("invoice")
    answer = {
        "vendor": "Copperline",
        "currency": "USD",
        "items": [{"description": "cards", "quantity": "500", "unit_price": "0.12"}],
        "total": "60",
    }
    coerced = coerce_numbers(answer, invoice)
    assert coerced["items"][0]["quantity"] == 500
    assert isinstance(coerced["items"][0]["quantity"], int)
    assert coerced["items"][0]["unit_price"] == 0.12
    assert coerced["total"] == 60 and coerced["vendor"] == "Copperline"
    assert valid(invoice, coerced)
    contract = load_schema("contract")
    value = {"parties": ["A", "B"], "start_date": "2024-01-01", "notice_days": None}
    assert coerce_numbers(value, contract) == value
    assert coerce_numbers({**value, "notice_days": "30"}, contract)["notice_days"] == 30
    person = coerce_numbers({"name": "Ada", "age": "thirty", "city": "X"}, load_schema("person"))
    assert person["age"] == "thirty"  # not a number: left as it is, scored wrong


@pytest.mark.parametrize(
    ("text", "integer", "expected"),
    [
        ("42", True, 42),
        (" 29 ", True, 29),
        ("29.0", True, 29),
        ("49,90", False, 49.9),
        ("1,250.50", False, 1250.5),
        ("75,000", False, 75000),  # invoice-04's IDR 75,000: it read 75.0, scored wrong
        ("1.250,5", False, 1250.5),
        ("7.5", True, 7.5),
        ("-3", False, -3),
        ("21 years", True, "21 years"),
        ("", True, ""),
    ],
)
def test_to_number(text: str, integer: bool, expected: Any) -> None:
    result = to_number(text, integer)
    assert result == expected and type(result) is type(expected)


def test_reorder_properties_moves_free_text_fields() -> None:
    ticket = load_schema("ticket")
    first = reorder_properties(ticket, evidence_first=True)
    assert list(first["properties"]) == ["summary", "category", "urgent"]
    assert first["required"] == ["summary", "category", "urgent"]
    last = reorder_properties(load_schema("candidate"), evidence_first=False)
    assert list(last["properties"]) == [
        "rate_skill_match",
        "final_recommendation",
        "brief_candidate_summary",
    ]
    assert list(ticket["properties"]) == ["category", "summary", "urgent"]  # unchanged
    router = reorder_properties(load_schema("router"), evidence_first=True)
    fetch, respond = router["properties"]["action"]["oneOf"]
    assert list(fetch["properties"]) == ["rationale", "tool_name", "user_id"]
    assert list(respond["properties"]) == ["content", "tool_name"]
    person = load_schema("person")
    assert reorder_properties(person, evidence_first=True) == person


def test_evidence_fields_are_plain_strings_only() -> None:
    assert is_evidence_field("summary", {"type": "string", "maxLength": 120})
    assert not is_evidence_field("summary", {"type": "string", "enum": ["a"]})
    assert not is_evidence_field("name", {"type": "string"})
    assert not is_evidence_field("description", {"type": "integer"})


@pytest.mark.parametrize("name", SCHEMAS)
def test_one_shot_example_validates(name: str) -> None:
    schema = load_schema(name)
    example = example_instance(schema)
    assert valid(schema, example), example
    assert valid(string_typed_schema(schema), example_instance(string_typed_schema(schema)))


def test_one_shot_prompt_holds_the_example_not_the_gold() -> None:
    schema = load_schema("person")
    task = {"instruction": "Extract.", "text": "Ada, 36, London.", "gold": {"name": "Ada"}}
    prompt = VARIANTS["constrained+one-shot"].prompt(task, schema)
    assert prompt.startswith("Extract.\n\nAda, 36, London.")
    assert '{"name": "...", "age": 1, "city": "..."}' in prompt
    assert VARIANTS["constrained"].prompt(task, schema) == "Extract.\n\nAda, 36, London."


def test_parse_variants() -> None:
    assert [v.name for v in parse_variants(None)] == list(DEFAULT_VARIANTS)
    assert [v.name for v in parse_variants("all")] == list(VARIANTS)
    assert [v.name for v in parse_variants("free, repair,free")] == ["free", "repair"]
    with pytest.raises(ValueError, match="unknown variant"):
        parse_variants("free,nonsense")
    with pytest.raises(ValueError, match="names no variant"):  # a matplotlib traceback
        parse_variants(" , ")


def test_string_typed_variant_finishes_in_the_original_types() -> None:
    variant = VARIANTS["string-typed"]
    schema = load_schema("person")
    assert variant.decoding_schema(schema)["properties"]["age"]["type"] == "string"
    assert variant.finish({"name": "A", "age": "29", "city": "B"}, schema)["age"] == 29
    assert VARIANTS["constrained"].finish({"age": "29"}, schema) == {"age": "29"}
