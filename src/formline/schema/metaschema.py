"""Is this a valid JSON Schema? The schema checked against its draft's meta-schema.

The meta-schema check ran in Python (``jsonschema``), and it cost 1.5 ms of a 5 ms compile of a
three-field schema (the 2020-12 meta-schema's ``$dynamicRef`` resolution, per subschema).
``jsonschema_rs`` (Rust) answers "valid?" in 4 µs, so it goes first; Python's check runs only
when the answer is no (its error message is the one users see) or when a string the Python
check would test against a format (a ``pattern`` as a regex, a ``$ref`` or ``$id`` as a
URI reference, ``$schema`` as a URI) does not conform: there the two differ, and the Python
check's verdict stands. Its ``regex`` format is ECMA-262's, as the grammar reads patterns
(:func:`~formline.schema.python_patterns.is_ecma_regex`): Python's ``re`` refused
``\\p{Letter}`` and ``\\cC``.
"""

from __future__ import annotations

import functools
from typing import Any

import jsonschema_rs
from jsonschema import FormatChecker
from jsonschema.exceptions import SchemaError as MetaSchemaError
from jsonschema.validators import Draft202012Validator, extend, validator_for

from formline.schema.bounded_patterns import with_bounded_patterns
from formline.schema.multiples import with_exact_multiples
from formline.schema.python_patterns import with_ecma_regex
from formline.schema.report import SchemaError, escape_pointer

# Keywords whose values the meta-schemas give a format the Python check asserts.
FORMAT_OF_KEYWORD = {
    "pattern": "regex",
    "$id": "uri-reference",
    "$ref": "uri-reference",
    "$dynamicRef": "uri-reference",
    "$recursiveRef": "uri-reference",
    "$schema": "uri",
}


def check_schema(schema: dict[str, Any] | bool) -> None:
    """Raise if ``schema`` is not valid under its draft's meta-schema.

    Raises:
        SchemaError: not a valid JSON Schema; the message is the meta-schema's, with the
            JSON pointer and keyword at fault.
    Costs about 5 µs plus a walk of the schema when valid (the Python check's milliseconds
    only for an invalid schema or an unusual ``pattern`` or URI).
    """
    check_dialect(schema)
    try:
        if _is_valid_fast(schema):
            return
    except (OverflowError, ValueError):  # a regex Python's re cannot even try (a{4294967296})
        pass  # the check below names it
    cls = validator_for(schema, default=Draft202012Validator)
    try:
        cls.check_schema(schema, format_checker=format_checker(cls))
    except (OverflowError, ValueError) as error:  # the regex format check lets these through
        message = f"not a valid JSON Schema: a pattern Python cannot read ({error})"
        raise SchemaError(message) from error
    except MetaSchemaError as error:
        path = [str(part) for part in error.absolute_path]
        keyword = path[-1] if path else None  # the user's keyword at fault, not the meta one
        pointer = "".join(f"/{escape_pointer(part)}" for part in path[:-1])
        raise SchemaError(f"not a valid JSON Schema: {error.message}", pointer, keyword) from error


def check_dialect(schema: Any) -> None:
    """Raise unless ``schema``'s ``$schema``, if any, is a string: jsonschema looks it up as
    a URI (``{"$schema": 5}`` raised AttributeError there, ``["x"]`` TypeError).

    Raises:
        SchemaError: ``$schema`` is present and not a string, naming ``$schema``.
    """
    if isinstance(schema, dict) and not isinstance(schema.get("$schema", ""), str):
        kind = type(schema["$schema"]).__name__
        raise SchemaError(f"$schema must be a URI string, not {kind}", "", "$schema")


def draft_validator_class(schema: Any) -> Any:
    """The validator class the after-check validates with: ``schema``'s own draft (2020-12
    without ``$schema``), reading ``nullable`` as the grammar does (:func:`with_nullable`)
    and ``multipleOf`` exactly (:mod:`formline.schema.multiples`: 19.99 is a multiple of
    0.01), its ``pattern`` bounded in time (:mod:`formline.schema.bounded_patterns`). Pair
    it with :func:`format_checker` of the class it returns.

    Raises:
        SchemaError: see :func:`check_dialect`.
    """
    check_dialect(schema)
    draft = validator_for(schema, default=Draft202012Validator)
    return with_nullable(with_bounded_patterns(with_exact_multiples(draft)))


@functools.cache
def with_nullable(cls: Any) -> Any:
    """``cls`` where a ``null`` beside ``"nullable": true`` (OpenAPI 3.0's form, which the
    grammar writes: ``values.typed_value``) passes ``type`` and the applicators next to it
    (``{"allOf": [{"$ref": ...}], "nullable": true}``, FastAPI's form); ``enum`` and
    ``const`` unchanged, as in OpenAPI 3.0.3. Without it every ``null`` the grammar allowed
    failed the after-check. Made once per draft. (A ``$ref`` into a resource with its own
    ``$schema`` is validated by that draft's stock class.)"""
    keywords = ("type", "allOf", "anyOf", "oneOf", "$ref")
    wrapped = {
        keyword: _passing_null(cls.VALIDATORS[keyword])
        for keyword in keywords
        if keyword in cls.VALIDATORS
    }
    return extend(cls, wrapped)


def _passing_null(base: Any) -> Any:
    def validate(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        if instance is None and schema.get("nullable") is True:
            return
        yield from base(validator, value, instance, schema)

    return validate


_CHECKERS: dict[Any, FormatChecker] = {}


def format_checker(cls: Any) -> FormatChecker:
    """The draft's format checker with ``regex`` read as ECMA-262 (made once per draft)."""
    checker = _CHECKERS.get(cls)
    if checker is None:
        checker = _CHECKERS[cls] = with_ecma_regex(cls.FORMAT_CHECKER)
    return checker


def _is_valid_fast(schema: dict[str, Any] | bool) -> bool:
    """``True`` only where the Python check would pass too: the Rust meta-schema check says
    valid, and every string at a formatted keyword conforms to Python's format checker.
    Strings under ``enum`` or ``default`` that look like those keywords are checked too (a
    walk that knows no keywords): a miss sends the schema to the Python check, never past it."""
    try:
        if not jsonschema_rs.meta.is_valid(schema):
            return False
    except Exception:  # an unknown $schema and the like: the Python check decides
        return False
    checker = format_checker(validator_for(schema, default=Draft202012Validator))
    # A string's verdict, once per (string, format): a schema names one "$ref" target many
    # times (meltano.schema: 51 references to 20 targets, 0.75 µs a check).
    verdicts: dict[tuple[str, str], bool] = {}
    pending: list[Any] = [schema]
    while pending:
        node = pending.pop()
        if isinstance(node, list):
            for value in node:
                if isinstance(value, dict | list):
                    pending.append(value)
            continue
        if not isinstance(node, dict):  # a boolean root schema
            continue
        for key, value in node.items():
            if isinstance(value, dict | list):
                if (
                    key == "patternProperties"
                    and isinstance(value, dict)
                    and not all(checker.conforms(name, "regex") for name in value)
                ):
                    return False
                pending.append(value)
            elif isinstance(value, str) and key in FORMAT_OF_KEYWORD:
                asked = (value, FORMAT_OF_KEYWORD[key])
                verdict = verdicts.get(asked)
                if verdict is None:
                    verdict = verdicts[asked] = checker.conforms(*asked)
                if not verdict:
                    return False
    return True
