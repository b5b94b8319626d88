"""The grammar, the keyword report and the after-check agree on keywords where they once
did not: a value the grammar writes passes the after-check, and what the grammar cannot hold
is on the report as checked after (a read-only review found each of these)."""

from __future__ import annotations

from typing import Any

import pytest

from formline.parser.pushdown import build_pushdown
from formline.schema import SchemaError, schema_to_grammar
from formline.schema.api import SchemaCheck

DRAFT4 = "http://json-schema.org/draft-04/schema#"


def accepts(schema: Any, text: bytes) -> bool:
    grammar, _ = schema_to_grammar(schema)
    return bool(build_pushdown(grammar).matches(text))


def checked_after(schema: Any) -> set[str]:
    _, report = schema_to_grammar(schema)
    return {use.keyword for use in report.checked_after}


def test_nullable_admits_null_in_the_grammar_and_the_after_check_alike() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string", "nullable": True}, "b": {"type": "string"}},
        "required": ["a", "b"],
    }
    assert accepts(schema, b'{"a":null,"b":"x"}') and not accepts(schema, b'{"a":"x","b":null}')
    check = SchemaCheck(schema)
    assert check.check({"a": None, "b": "x"}) == []  # was "None is not of type 'string'"
    assert check.check({"a": "x", "b": None}) != []
    enum = {"type": "string", "enum": ["a"], "nullable": True}  # OpenAPI 3.0.3: type only
    assert not accepts(enum, b"null") and SchemaCheck(enum).check(None) != []
    # FastAPI's form: the $ref's own "type": "object" sits inside the allOf.
    shared = {
        "$defs": {"X": {"type": "object", "properties": {"a": {"type": "integer"}}}},
        "type": "object",
        "properties": {"x": {"allOf": [{"$ref": "#/$defs/X"}], "nullable": True}},
    }
    assert accepts(shared, b'{"x":null}') and SchemaCheck(shared).check({"x": None}) == []
    assert SchemaCheck(shared).check({"x": 3}) != []


def test_one_of_nullable_branches_is_not_exclusive() -> None:
    # Both branches admit null: the grammar wrote it and reported oneOf enforced, and the
    # after-check refused it ("None is valid under each of ...").
    both = {"oneOf": [{"type": "string", "nullable": True}, {"type": "integer", "nullable": True}]}
    assert accepts(both, b"null") and "oneOf" in checked_after(both)
    one = {"oneOf": [{"type": "string", "nullable": True}, {"type": "integer"}]}
    assert "oneOf" not in checked_after(one)
    # Under a parent object type, a tag told the branches apart, but not their nulls.
    tagged = [
        {"nullable": True, "properties": {"k": {"const": tag}}, "required": ["k"]}
        for tag in ("a", "b")
    ]
    assert "oneOf" in checked_after({"type": "object", "oneOf": tagged})


def test_min_properties_met_by_extra_members_is_checked_after() -> None:
    # {"a":1,"a":2} has two members in the text and one once parsed.
    assert accepts({"type": "object", "minProperties": 2}, b'{"a":1,"a":2}')
    assert "minProperties" in checked_after({"type": "object", "minProperties": 2})
    closed = {"properties": {"a": {}, "b": {}}, "additionalProperties": False}
    assert "minProperties" not in checked_after({"type": "object", "minProperties": 2, **closed})


def test_all_of_compares_values_as_json_not_as_python() -> None:
    with pytest.raises(SchemaError, match="accepts no value"):  # 1 == True in Python
        schema_to_grammar({"allOf": [{"const": 1}, {"const": True}]})


@pytest.mark.parametrize(
    ("branches", "accepted", "refused"),
    [
        ([{"minimum": 5, "exclusiveMinimum": True}, {"minimum": 6}], [b"6", b"7"], [b"5.5"]),
        ([{"minimum": 5, "exclusiveMinimum": True}, {"minimum": 5}], [b"5.5"], [b"5"]),
        ([{"maximum": 5, "exclusiveMaximum": True}, {"maximum": 6}], [b"4"], [b"5"]),
    ],
)
def test_draft4_exclusive_flags_follow_their_own_bound(
    branches: list[Any], accepted: list[bytes], refused: list[bytes]
) -> None:
    schema = {"$schema": DRAFT4, "type": "number", "allOf": branches}
    assert all(accepts(schema, text) for text in accepted)
    assert not any(accepts(schema, text) for text in refused)


def test_a_tag_makes_one_of_exclusive_only_among_objects() -> None:
    tagged = [
        {"properties": {"k": {"const": "a"}}, "required": ["k"]},
        {"properties": {"k": {"const": "b"}}, "required": ["k"]},
    ]
    assert "oneOf" in checked_after({"oneOf": tagged})  # "x" matches both branches
    objects = [{"type": "object", **branch} for branch in tagged]
    assert "oneOf" not in checked_after({"oneOf": objects})
    assert "oneOf" not in checked_after({"type": "object", "oneOf": tagged})  # typed beside


def test_property_names_beside_patterns_is_on_the_report() -> None:
    schema = {
        "type": "object",
        "patternProperties": {"^x": {}},
        "propertyNames": {"maxLength": 2},
        "additionalProperties": False,
    }
    assert accepts(schema, b'{"xxxx":1}')  # the pattern's key: propertyNames cannot hold it
    assert "propertyNames" in checked_after(schema)  # it was on no list at all


def test_overlapping_patterns_are_on_the_report() -> None:
    # A key must meet every pattern it matches; the grammar writes it through one pattern's
    # branch. {"ab":1} broke b$'s minimum under a report that said patternProperties held.
    schema = {
        "type": "object",
        "patternProperties": {"^a": {"type": "integer"}, "b$": {"minimum": 3}},
        "additionalProperties": False,
    }
    assert accepts(schema, b'{"ab":1}') and SchemaCheck(schema).check({"ab": 1}) != []
    assert "patternProperties" in checked_after(schema)
    alone = {"type": "object", "patternProperties": {"^a": {}}, "additionalProperties": False}
    assert "patternProperties" not in checked_after(alone)


def test_all_of_additional_properties_meets_the_other_branch_patterns() -> None:
    # A name the other branch's pattern matches is that pattern's, not additional there.
    declared = {"type": "object", "properties": {"foo1": {"type": "string"}}}
    patterned = {
        "type": "object",
        "patternProperties": {"^foo": {"type": "string"}},
        "additionalProperties": False,
    }
    both = {"allOf": [declared, patterned]}
    assert accepts(both, b'{"foo1":"x"}') and SchemaCheck(both).check({"foo1": "x"}) == []
    assert not accepts(both, b'{"foo1":1}')
    # A key only one branch's pattern admits, beside the other's additionalProperties: false,
    # has no exact merge: the grammar admits it, the report says so and the after-check
    # refuses it (it was reported enforced).
    closed = {"type": "object", "properties": {"a": {}}, "additionalProperties": False}
    opened = {"type": "object", "patternProperties": {"^bar": {"type": "string"}}}
    loose = {"allOf": [opened, closed]}
    assert "additionalProperties" in checked_after(loose)
    assert SchemaCheck(loose).check({"bar9": "x"}) != []
    assert "additionalProperties" not in checked_after({"allOf": [declared, closed]})
