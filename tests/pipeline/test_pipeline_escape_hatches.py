"""Escape hatches that hold (formline.pipeline.escape_hatches): the null or "other" a hatch
adds is taken by the grammar and by the after-check, whatever keywords sit beside the
field's type."""

from __future__ import annotations

import json
from typing import Any

import pytest

from formline.pipeline.escape_hatches import apply_escape_hatches
from formline.schema import compile_schema
from formline.schema.report import SchemaError


def required(field: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": {"k": field}, "required": ["k"], **extra}


CASES = [
    # A null in "type" still failed an allOf/oneOf branch with its own type, a not, an if.
    (required({"type": "string", "allOf": [{"$ref": "#/$defs/C"}]}, **{
        "$defs": {"C": {"type": "string", "minLength": 2}}}), {"k": None}),
    (required({"type": "integer", "oneOf": [
        {"type": "integer", "minimum": 0}, {"type": "integer", "maximum": -10}]}), {"k": None}),
    (required({"type": "string", "enum": ["a", "b"], "not": {"type": "null"}}), {"k": None}),
    # "other" beside a maxLength or pattern it breaks is a branch of its own.
    (required({"type": "string", "enum": ["EUR", "USD"], "maxLength": 3}), {"k": "other"}),
    (required({"type": "string", "enum": ["EUR", "USD"], "pattern": "^[A-Z]{3}$"}),
     {"k": "other", "k_other": "GBP"}),
    # A $ref inside the enum's field could not be read on its own (PointerToNowhere).
    (required({"enum": ["a", "b"], "allOf": [{"$ref": "#/$defs/S"}]}, **{
        "$defs": {"S": {"type": "string", "maxLength": 1}}}), {"k": "other"}),
]  # fmt: skip


@pytest.mark.parametrize(("schema", "instance"), CASES)
def test_what_a_hatch_adds_is_taken_by_the_grammar_and_the_after_check(
    schema: dict[str, Any], instance: dict[str, Any], smollm2_vocab: Any
) -> None:
    hatched = apply_escape_hatches(schema, True)
    compiled = compile_schema(hatched, smollm2_vocab, disk_cache=False)
    assert compiled.check(instance) == []
    matcher = compiled.matcher()
    assert matcher.accept_string(json.dumps(instance, separators=(",", ":"))), hatched
    assert matcher.can_end()
    # And the field's own values stay as they were.
    assert compile_schema(schema, smollm2_vocab, disk_cache=False).check(instance) != []


def test_an_enum_whose_keywords_take_other_just_gains_it() -> None:
    hatched = apply_escape_hatches(required({"type": "string", "enum": ["a", "b"]}), True)
    field = hatched["properties"]["k"]
    assert field == {"type": ["string", "null"], "enum": ["a", "b", "other", None]}


def test_a_const_named_by_path_becomes_nullable(smollm2_vocab: Any) -> None:
    hatched = apply_escape_hatches(required({"type": "string", "const": "x"}), ["k"])
    compiled = compile_schema(hatched, smollm2_vocab, disk_cache=False)
    assert compiled.check({"k": None}) == [] and compiled.check({"k": "y"}) != []


def test_the_reason_key_passes_the_objects_property_names(smollm2_vocab: Any) -> None:
    # propertyNames refused "k_other": the grammar and the after-check refused the reason
    # the hatch had added, and nothing said so.
    schema = required({"type": "string", "enum": ["a", "b"]}, propertyNames={"maxLength": 2})
    hatched = apply_escape_hatches(schema, True)
    compiled = compile_schema(hatched, smollm2_vocab, disk_cache=False)
    instance = {"k": "other", "k_other": "c"}
    assert compiled.check(instance) == []
    assert compiled.matcher().accept_string(json.dumps(instance, separators=(",", ":")))
    assert compiled.check({"k": "a", "xyz": 1}) != []  # other long names stay refused


def test_a_reason_key_that_a_pattern_property_would_judge_is_named() -> None:
    schema = required(
        {"type": "string", "enum": ["a", "b"]},
        patternProperties={"_other$": {"type": "integer"}},
    )
    with pytest.raises(SchemaError, match=r"'k_other' matches patternProperties '_other\$'"):
        apply_escape_hatches(schema, True)


@pytest.mark.parametrize("judge", [{}, {"type": "string"}])
def test_a_catch_all_pattern_that_takes_the_reason_is_no_obstacle(
    judge: dict[str, Any], smollm2_vocab: Any
) -> None:
    schema = required({"type": "string", "enum": ["a", "b"]}, patternProperties={".*": judge})
    hatched = apply_escape_hatches(schema, True)  # raised SchemaError for any match
    compiled = compile_schema(hatched, smollm2_vocab, disk_cache=False)
    assert compiled.check({"k": "other", "k_other": "c"}) == []
