"""Closing open objects (``additionalProperties: false``, as vLLM's xgrammar does) only where
it narrows: every value the closed schema accepts, the client's schema accepts."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from formline.schema.closing import close_objects

OPEN_A = {"type": "object", "properties": {"a": {"type": "integer"}}}
ONE_OF = {
    "oneOf": [
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
        {"type": "object", "properties": {"b": {"type": "integer"}}},
    ]
}
# Schemas where closing in the wrong place changes what they mean.
TRICKY: dict[str, dict[str, Any]] = {
    "oneOf": ONE_OF,
    "not": {"type": "object", "not": OPEN_A},
    "if/then/else": {"if": OPEN_A, "then": {"required": ["a"]}, "else": {"type": "object"}},
    "dependentSchemas": {"type": "object", "dependentSchemas": {"b": {"not": OPEN_A}}},
    "contains": {"type": "array", "contains": {"not": OPEN_A}},
    "propertyNames": {"propertyNames": {"not": {"const": "x"}}, "properties": {"a": {}}},
    "unevaluatedProperties": {"properties": {"a": {}}, "unevaluatedProperties": OPEN_A},
    "$defs under oneOf and properties": {
        "$defs": {"A": OPEN_A},
        "properties": {
            "p": {"$ref": "#/$defs/A"},
            "o": {"oneOf": [{"$ref": "#/$defs/A"}, {"properties": {"b": {"type": "integer"}}}]},
        },
    },
    "$defs reached through a $defs entry under not": {
        "$defs": {"A": {"$ref": "#/$defs/B"}, "B": OPEN_A},
        "properties": {"p": {"$ref": "#/$defs/B"}, "q": {"not": {"$ref": "#/$defs/A"}}},
    },
    "# under not": {
        "anyOf": [{"type": "integer"}, {"properties": {"a": {"not": {"$ref": "#"}}}}],
    },
    "anyOf beside properties": {
        "type": "object",
        "properties": {"a": {}},
        "anyOf": [{"properties": {"b": {}}, "required": ["b"]}, {"required": ["a"]}],
    },
    "allOf": {"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]},
    "$ref beside properties": {
        "$defs": {"A": {"properties": {"a": {}}}},
        "$ref": "#/$defs/A",
        "properties": {"b": {}},
    },
    "nested, closable": {
        "properties": {
            "o": {"properties": {"x": {"type": "integer"}}},
            "l": {"items": {"anyOf": [OPEN_A, {"type": "null"}]}},
        }
    },
}

keys = st.sampled_from(["a", "b", "x", "p", "q", "o", "l"])
leaves = st.none() | st.booleans() | st.integers(-2, 2) | st.sampled_from(["", "x"])
instances = st.recursive(
    leaves,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(keys, children, max_size=4),
    max_leaves=12,
)


def accepts(schema: Any, instance: Any) -> bool:
    return bool(Draft202012Validator(schema).is_valid(instance))


@pytest.mark.parametrize("name", sorted(TRICKY))
@settings(max_examples=300, deadline=None)
@given(instance=instances)
# Values that an object closed in the wrong place lets through (each trips one TRICKY entry).
@example(instance={"a": 0})
@example(instance={"x": 1})
@example(instance={"o": {"a": 0}})
@example(instance={"a": 0, "x": 1})
@example(instance={"a": {"b": 1}})
@example(instance={"b": {"a": 1, "x": 1}})
@example(instance=[{"a": 1, "x": 1}])
@example(instance={"p": {"a": 1}, "b": 1})
@example(instance={"q": {"a": 1, "x": 1}})
def test_the_closed_schema_accepts_a_subset(name: str, instance: Any) -> None:
    schema = TRICKY[name]
    if accepts(close_objects(schema), instance):
        assert accepts(schema, instance), (name, close_objects(schema))


def test_a_value_matching_both_one_of_branches_stays_invalid() -> None:
    closed = close_objects(ONE_OF)
    assert closed == ONE_OF
    assert not accepts(ONE_OF, {"a": 123}) and not accepts(closed, {"a": 123})
    assert accepts(closed, {"a": 1, "b": "x"})  # only the first branch matches: valid


@pytest.mark.parametrize(
    "name",
    ["oneOf", "not", "if/then/else", "dependentSchemas", "contains", "unevaluatedProperties"],
)
def test_nothing_is_closed_under_a_keyword_that_does_not_narrow(name: str) -> None:
    assert close_objects(TRICKY[name]) == TRICKY[name]


def test_a_definition_used_where_closing_does_not_narrow_stays_open() -> None:
    closed = close_objects(TRICKY["$defs under oneOf and properties"])
    assert "additionalProperties" not in closed["$defs"]["A"]
    transitive = close_objects(TRICKY["$defs reached through a $defs entry under not"])
    assert "additionalProperties" not in transitive["$defs"]["B"]
    assert close_objects(TRICKY["# under not"]) == TRICKY["# under not"]


def test_objects_at_narrowing_positions_are_still_closed() -> None:
    closed = close_objects(TRICKY["nested, closable"])
    assert closed["additionalProperties"] is False
    assert closed["properties"]["o"]["additionalProperties"] is False
    assert closed["properties"]["l"]["items"]["anyOf"][0]["additionalProperties"] is False
    assert not accepts(closed, {"o": {"x": 1, "title": "x"}})
    assert accepts(TRICKY["nested, closable"], {"o": {"x": 1, "title": "x"}})
    used_twice = {
        "$defs": {"A": OPEN_A},
        "properties": {"p": {"$ref": "#/$defs/A"}, "q": {"items": {"$ref": "#/$defs/A"}}},
    }
    assert close_objects(used_twice)["$defs"]["A"]["additionalProperties"] is False


def test_siblings_that_add_keys_keep_the_object_open() -> None:
    assert close_objects(TRICKY["allOf"]) == TRICKY["allOf"]
    beside = close_objects(TRICKY["anyOf beside properties"])
    assert "additionalProperties" not in beside
    assert all("additionalProperties" not in branch for branch in beside["anyOf"])
    referenced = close_objects(TRICKY["$ref beside properties"])
    assert "additionalProperties" not in referenced["$defs"]["A"]
    assert accepts(referenced, {"a": 1, "b": 2})
