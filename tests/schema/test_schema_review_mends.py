"""Soundness defects a review found, each with its repro: the grammar refused a value the
after-check accepts, or accepted one it refuses under a report that said exact."""

from __future__ import annotations

import json
from typing import Any

import pytest

from formline.parser.pushdown import build_pushdown
from formline.schema import SchemaError, bounded_patterns, schema_to_grammar
from formline.schema.api import SchemaCheck, serialize_like_schema

DRAFT4 = "http://json-schema.org/draft-04/schema#"


def accepts(schema: Any, text: str, **options: Any) -> bool:
    grammar, _ = schema_to_grammar(schema, **options)
    return bool(build_pushdown(grammar).matches(text.encode()))


def is_valid(schema: Any, text: str) -> bool:
    return SchemaCheck(schema).check(json.loads(text)) == []


def checked_after(schema: Any, **options: Any) -> set[str]:
    _, report = schema_to_grammar(schema, **options)
    return {use.keyword for use in report.checked_after}


def is_exact(schema: Any, **options: Any) -> bool:
    _, report = schema_to_grammar(schema, **options)
    return report.is_exact()


@pytest.mark.parametrize(
    ("names", "allowed"),
    [
        ({"format": "email"}, "a@b.co"),  # was checked without the format checker
        ({"enum": ["$ref"]}, "$ref"),  # a "$ref" anywhere inside skipped the check
        ({"$ref": "#/$defs/Short"}, "z"),
    ],
)
def test_property_names_filter_declared_names_as_the_after_check_does(
    names: Any, allowed: str
) -> None:
    schema = {
        "$defs": {"Short": {"maxLength": 1}},
        "type": "object",
        "properties": {"xy": {}, allowed: {"type": "integer"}},
        "propertyNames": names,
        "additionalProperties": False,
    }
    assert not is_valid(schema, '{"xy":1}') and is_exact(schema)
    assert not accepts(schema, '{"xy":1}')  # was accepted under an exact report
    member = json.dumps({allowed: 1}, separators=(",", ":"))
    assert is_valid(schema, member) and accepts(schema, member)
    with pytest.raises(SchemaError, match="accepts no value"):  # xy required, xy refused
        schema_to_grammar({**schema, "required": ["xy"]})


def test_nullable_stays_in_a_merge_only_where_every_side_admits_null() -> None:
    nullable = {"type": "string", "nullable": True}
    refused = [
        {"allOf": [nullable, {"type": "string"}]},
        {"allOf": [{"type": "string"}, nullable]},
        {"type": "string", "anyOf": [nullable]},
        {"allOf": [nullable, {"anyOf": [{"type": "string"}]}]},
    ]
    for schema in refused:  # null was accepted under an exact report
        assert not is_valid(schema, "null") and not accepts(schema, "null"), schema
    admitted = [
        {"allOf": [nullable, nullable]},
        {"allOf": [nullable, {"type": ["string", "null"]}]},
        {"allOf": [nullable, {"anyOf": [{"type": "null"}, {"type": "string"}]}]},
        # null passes the type and the applicators beside "nullable": true
        {"type": "string", "nullable": True, "anyOf": [{"type": "string"}]},
        {"type": "string", "nullable": True, "allOf": [{"type": "integer"}]},
    ]
    for schema in admitted:
        assert is_valid(schema, "null") and accepts(schema, "null"), schema


def test_an_enum_beside_nullable_keeps_its_null() -> None:
    schema = {"type": "string", "nullable": True, "enum": ["ab", None], "minLength": 1}
    assert is_valid(schema, "null") and accepts(schema, "null")  # the filter dropped it
    assert accepts(schema, '"ab"')


@pytest.mark.parametrize("reference", ["a/schema.json", "#/$defs/A"])
def test_a_relative_id_reached_through_a_ref_is_entered_once(reference: str) -> None:
    schema = {
        "$id": "http://x.com/root.json",
        "$defs": {
            "A": {"$id": "a/schema.json", "$defs": {"B": {"type": "integer"}}, "$ref": "#/$defs/B"}
        },
        "properties": {"p": {"$ref": reference}},
    }
    assert is_valid(schema, '{"p":1}') and accepts(schema, '{"p":1}')  # was a SchemaError
    assert not accepts(schema, '{"p":"x"}')


def test_an_unreadable_pattern_lets_its_keys_through_to_the_after_check() -> None:
    schema = {
        "type": "object",
        "properties": {"y": {"type": "string"}},
        "patternProperties": {"^(?=x)": {"type": "integer"}},
        "additionalProperties": False,
    }
    options = {"on_unsupported": "check_after"}
    assert is_valid(schema, '{"xa":1}') and accepts(schema, '{"xa":1}', **options)
    assert not is_exact(schema, **options)
    assert {"patternProperties", "additionalProperties"} <= checked_after(schema, **options)
    assert not accepts(schema, '{"y":1}', **options)  # a declared name keeps its schema
    with pytest.raises(SchemaError, match="patternProperties"):
        schema_to_grammar(schema)


def test_draft4_enum_values_are_filtered_by_draft4_bounds() -> None:
    above = {"$schema": DRAFT4, "enum": [5, 6], "minimum": 5, "exclusiveMinimum": True}
    assert not is_valid(above, "5") and not accepts(above, "5")  # was accepted, exact
    assert accepts(above, "6")
    below = {"$schema": DRAFT4, "enum": [1, 2], "maximum": 2, "exclusiveMaximum": True}
    assert is_valid(below, "1") and accepts(below, "1")  # "accepts no value" before
    assert not accepts(below, "2")


@pytest.mark.parametrize("text", ['{"x" :[1,2]}', '{"x":[1 ,2]}', '{ "x" : [ 1 , 2 ] }'])
def test_literals_take_whitespace_where_other_values_do(text: str) -> None:
    schema = {"const": {"x": [1, 2]}}
    assert is_valid(schema, text) and accepts(schema, text, whitespace=4)
    assert accepts({"type": "object"}, text, whitespace=4)
    assert not accepts(schema, '{"x" :[1 ,3]}', whitespace=4)


@pytest.mark.parametrize("dialect", [5, ["x"]])
def test_a_schema_uri_that_is_not_a_string_is_a_schema_error(dialect: Any) -> None:
    with pytest.raises(SchemaError) as raised:  # AttributeError, TypeError before
        schema_to_grammar({"$schema": dialect})
    assert raised.value.keyword == "$schema"


def test_a_pattern_left_to_the_after_check_is_decided_in_bounded_time(monkeypatch) -> None:
    # Python's re ran ^(?!x)(a|a)*$ on the 28 characters a...ab for 36 s holding the GIL
    # (the server's event loop stopped); each "a" more doubled it.
    monkeypatch.setattr(bounded_patterns, "PATTERN_SECONDS", 0.05)
    monkeypatch.setattr(bounded_patterns, "VALIDATION_SECONDS", 0.2)
    schema = {"type": "array", "items": {"type": "string", "pattern": "^(?!x)(a|a)*$"}}
    findings = SchemaCheck(schema).check(["a" * 60 + "b"] * 50)
    assert len(findings) == 50  # past the validation's time, the others are findings at once
    assert all("was not decided" in finding for finding in findings)
    assert SchemaCheck(schema).check(["aaa"]) == []  # a normal match still passes
    assert SchemaCheck(schema).check(["x"]) != []


def test_a_pattern_nested_past_pythons_depth_is_a_schema_error() -> None:
    pattern = "(" * 600 + "a" + ")" * 600  # a RecursionError in the format check: a 500
    with pytest.raises(SchemaError, match="pattern"):
        schema_to_grammar({"type": "string", "pattern": pattern})


@pytest.mark.parametrize(
    ("schema", "value"),
    [
        ({"const": {"x": {"b": 1, "a": 2}}}, {"x": {"a": 2, "b": 1}}),
        ({"enum": [[{"b": 1, "a": [{"d": 0, "c": 1}]}]]}, [{"a": [{"c": 1, "d": 0}], "b": 1}]),
        (
            {
                "$ref": "#/$defs/T",
                "allOf": [{"properties": {"b": {}}}],
                "$defs": {"T": {"properties": {"a": {}}}},
            },
            {"a": 1, "b": 2},
        ),
    ],
)
def test_serialize_writes_what_the_grammar_writes(schema: Any, value: Any) -> None:
    # Nested literals kept the value's own key order, and a $ref's sibling allOf was merged
    # after its target: the "text the grammar writes" was refused by the grammar.
    text = serialize_like_schema(schema, value)
    assert json.loads(text) == value and accepts(schema, text)


def test_key_patterns_of_the_after_check_are_bounded_too(monkeypatch) -> None:
    # patternProperties and additionalProperties ran re.search on the keys: 4.5 s on a
    # 26-character key, holding the GIL.
    monkeypatch.setattr(bounded_patterns, "PATTERN_SECONDS", 0.05)
    hostile = "^(?!x)(a|a)*$"
    key = "a" * 60 + "b"
    for schema in (
        {"patternProperties": {hostile: {"type": "integer"}}},
        {"patternProperties": {hostile: {}}, "additionalProperties": False},
    ):
        findings = SchemaCheck(schema).check({key: 1})
        assert findings and all("was not decided on the key" in text for text in findings)
    closed = {"properties": {"a": {}}, "additionalProperties": False}
    assert SchemaCheck(closed).check({"a": 1, "b": 2, "c": 3}) == [
        "Additional properties are not allowed ('b', 'c' were unexpected) (at /)"
    ]
