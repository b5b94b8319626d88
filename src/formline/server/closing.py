"""vLLM/xgrammar's default for open objects: ``additionalProperties: false``.

xgrammar (vLLM's default structured-output backend) compiles JSON Schemas in strict mode:
an object schema that lists ``properties`` and says nothing about other keys gets no other
keys. Clients written against vLLM rely on it (a Pydantic ``model_json_schema()`` leaves
objects open; decoded under an open schema, a small model adds keys such as ``"title"``).
``formline serve`` applies the same default so such clients get the same objects; the
after-check then validates against the closed schema, which is stricter than the original.

Not closed: an object with ``additionalProperties``, ``patternProperties`` or
``unevaluatedProperties`` of its own; one with ``allOf`` or a ``$ref`` beside its
properties; and the branches of an ``allOf`` (their siblings contribute properties).
"""

from __future__ import annotations

from typing import Any

SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
SCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
SCHEMA_SINGLES = (
    "items", "additionalProperties", "not", "if", "then", "else", "contains",
    "propertyNames", "unevaluatedItems", "unevaluatedProperties", "additionalItems",
)  # fmt: skip
OPENERS = ("additionalProperties", "patternProperties", "unevaluatedProperties", "allOf", "$ref")


def close_objects(schema: Any, inside_all_of: bool = False) -> Any:
    """A copy of ``schema`` whose open object schemas are closed (see the module's doc).

    Costs one walk over the schema; the input is not changed.
    """
    if not isinstance(schema, dict):
        return schema
    closed: dict[str, Any] = {}
    for key, value in schema.items():
        if key in SCHEMA_MAPS and isinstance(value, dict):
            closed[key] = {name: close_objects(sub) for name, sub in value.items()}
        elif key in SCHEMA_LISTS and isinstance(value, list):
            closed[key] = [close_objects(sub) for sub in value]
        elif key == "allOf" and isinstance(value, list):
            closed[key] = [close_objects(sub, inside_all_of=True) for sub in value]
        elif key in SCHEMA_SINGLES or (key == "items" and isinstance(value, list)):
            items = isinstance(value, list)
            closed[key] = [close_objects(sub) for sub in value] if items else close_objects(value)
        else:
            closed[key] = value
    opened = any(key in schema for key in OPENERS)
    if "properties" in schema and not opened and not inside_all_of:
        closed["additionalProperties"] = False
    return closed
