"""The meta-schema check: the Rust fast path never lets through a schema the Python check
refuses, and an invalid schema gets the Python check's message, pointer and keyword."""

import json
from pathlib import Path

import pytest
from jsonschema.exceptions import SchemaError as MetaSchemaError
from jsonschema.validators import Draft202012Validator, validator_for

from formline.schema import SchemaError
from formline.schema.metaschema import _is_valid_fast, check_schema, format_checker

DATA = Path(__file__).resolve().parents[1] / "data"


def corpus() -> list[object]:
    schemas: list[object] = []
    for path in sorted((DATA / "json-schema-test-suite" / "tests").rglob("*.json")):
        groups = json.loads(path.read_text())
        schemas.extend(group["schema"] for group in groups if isinstance(group, dict))
    for path in sorted((DATA / "maskbench").glob("*.json")):
        schemas.append(json.loads(path.read_text())["schema"])
    return schemas


def is_valid_in_python(schema: object) -> bool:
    """The Python check as formline runs it (its ``regex`` format ECMA-262's)."""
    cls = validator_for(schema, default=Draft202012Validator)
    try:
        cls.check_schema(schema, format_checker=format_checker(cls))
    except MetaSchemaError:
        return False
    return True


def test_the_fast_path_never_passes_what_the_python_check_refuses() -> None:
    schemas = corpus()
    fast = [schema for schema in schemas if _is_valid_fast(schema)]
    assert len(schemas) > 1_000
    assert len(fast) > 0.9 * len(schemas)  # the fast path is the common one
    assert all(is_valid_in_python(schema) for schema in fast)


@pytest.mark.parametrize(
    ("schema", "pointer", "keyword"),
    [
        ({"type": "strng"}, "", "type"),
        ({"properties": {"a": {"minimum": "5"}}}, "/properties/a", "minimum"),
        ({"required": "name"}, "", "required"),
        ({"$defs": {"x/y": {"maxLength": -1}}}, "/$defs/x~1y", "maxLength"),
    ],
)
def test_an_invalid_schema_names_the_keyword_and_where(schema, pointer, keyword) -> None:
    with pytest.raises(SchemaError, match="not a valid JSON Schema") as caught:
        check_schema(schema)
    assert caught.value.pointer == pointer
    assert caught.value.keyword == keyword


def test_a_pattern_no_reader_can_read_goes_to_the_python_check() -> None:
    schema = {"type": "string", "pattern": "(unclosed"}
    assert not _is_valid_fast(schema)
    with pytest.raises(SchemaError, match="not a valid JSON Schema"):
        check_schema(schema)


def test_an_ecma_pattern_python_cannot_compile_is_valid() -> None:
    # \p{Letter} is an ECMA-262 regex but not a Python one: JSON Schema's dialect decides.
    schema = {"type": "string", "pattern": "\\p{Letter}+", "patternProperties": {"\\cC": {}}}
    assert _is_valid_fast(schema)
    check_schema(schema)
