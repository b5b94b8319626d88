"""``allOf`` as one schema: merge two schema objects into one whose instances are (at most)
the instances of both.

Where a pair of keywords has an exact merge (types intersect, bounds tighten, properties and
``required`` combine, lengths and counts tighten, enums intersect) the result is exact. Where
it has none (two different ``pattern`` or ``format`` values, two ``not``), the first stays in
the merged schema and the second is returned as a note: the compiler reports it as checked
after decoding, where :meth:`CompiledSchema.check` validates the original schema anyway.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

from formline.schema.python_patterns import is_pattern_match
from formline.schema.report import SchemaError

Schema = dict[str, Any]
LOWER_BOUNDS = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties")
UPPER_BOUNDS = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties")
ALL_TYPES = ("null", "boolean", "object", "array", "number", "integer", "string")
TYPE_KEYWORDS = {
    "string": ("minLength", "maxLength", "pattern", "format"),
    "number": ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
    "array": ("items", "prefixItems", "additionalItems", "minItems", "maxItems"),
    "object": (
        "properties",
        "required",
        "additionalProperties",
        "patternProperties",
        "propertyNames",
        "minProperties",
        "maxProperties",
    ),
}
ALL_TYPE_KEYWORDS = frozenset(k for keywords in TYPE_KEYWORDS.values() for k in keywords)
MAX_COMBINED_BRANCHES = 64  # anyOf x anyOf distributes; past this the second goes after
# The keywords a null passes beside "nullable": true (as the after-check reads OpenAPI 3.0's
# form): the object's own type and its applicators.
NULLABLE_APPLICATORS = ("allOf", "anyOf", "oneOf", "$ref")


def as_object(schema: Any, pointer: str) -> Schema:
    """A boolean schema as an object (``true`` -> ``{}``, ``false`` -> ``{"not": {}}``).

    Raises:
        SchemaError: ``schema`` is neither an object nor a boolean.
    """
    if schema is True:
        return {}
    if schema is False:
        return {"enum": []}
    if not isinstance(schema, dict):
        raise SchemaError(f"a schema must be an object or a boolean, not {schema!r:.60}", pointer)
    return schema


def type_set(schema: Schema, pointer: str) -> set[str] | None:
    """The ``type`` keyword as a set (``None``: absent).

    Raises:
        SchemaError: ``type`` is not a type name or a list of them.
    """
    declared = schema.get("type")
    if declared is None:
        return None
    names = declared if isinstance(declared, list) else [declared]
    for name in names:
        if name not in ALL_TYPES:
            raise SchemaError(f"unknown type {name!r}", pointer, "type")
    return set(names)


def intersect_types(first: set[str] | None, second: set[str] | None) -> set[str] | None:
    """Types allowed by both (``integer`` is a ``number``)."""
    if first is None:
        return second
    if second is None:
        return first
    result = first & second
    if ("number" in first and "integer" in second) or ("integer" in first and "number" in second):
        result.add("integer")
    return result


def merge(first: Schema, second: Schema, pointer: str) -> tuple[Schema, list[tuple[str, str]]]:
    """One schema for ``allOf: [first, second]`` and the (keyword, note) pairs not merged.

    Raises:
        SchemaError: a malformed ``type``.
    Costs O(keywords); nested property schemas merge lazily (as a nested ``allOf``).
    """
    merged = dict(first)
    notes: list[tuple[str, str]] = []
    array_keywords = ("items", "prefixItems", "additionalItems")
    for keyword, value in second.items():
        if keyword in array_keywords or keyword == "nullable":
            continue
        if keyword not in merged:
            merged[keyword] = value
            continue
        if json_equal(merged[keyword], value):  # Python's == has 1 == true
            continue
        _merge_keyword(merged, keyword, value, pointer, notes)
    _merge_boolean_exclusives(merged, first, second)
    if "type" in first and "type" in second:
        types = intersect_types(type_set(first, pointer), type_set(second, pointer))
        merged["type"] = sorted(types or [])
    _merge_nullable(merged, first, second, pointer, notes)
    _merge_object_keywords(merged, first, second, notes)
    if any(keyword in schema for schema in (first, second) for keyword in array_keywords):
        for keyword in array_keywords:
            merged.pop(keyword, None)
        merged.update(_merge_array_keywords(first, second))
    return merged, notes


def _merge_keyword(
    merged: Schema, keyword: str, value: Any, pointer: str, notes: list[tuple[str, str]]
) -> None:
    current = merged[keyword]
    if keyword in LOWER_BOUNDS and _is_number(current) and _is_number(value):
        merged[keyword] = max(current, value, key=lambda number: Decimal(str(number)))
    elif keyword in UPPER_BOUNDS and _is_number(current) and _is_number(value):
        merged[keyword] = min(current, value, key=lambda number: Decimal(str(number)))
    elif keyword == "required":
        merged[keyword] = list(dict.fromkeys([*current, *value]))
    elif keyword == "enum":
        merged[keyword] = [item for item in current if _json_in(item, value)]
    elif keyword == "const":
        merged["enum"] = [] if not json_equal(current, value) else [current]
        merged.pop("const")
    elif keyword in ("properties", "patternProperties", "$defs", "definitions"):
        combined = dict(current)
        for name, schema in value.items():
            combined[name] = {"allOf": [combined[name], schema]} if name in combined else schema
        merged[keyword] = combined
    elif keyword in ("additionalProperties", "propertyNames"):
        merged[keyword] = {"allOf": [current, value]}
    elif keyword in ("anyOf", "oneOf"):
        _merge_branches(merged, keyword, value, notes)
    elif keyword == "allOf":
        merged[keyword] = [*current, *value]
    elif keyword == "multipleOf" and _are_integers(current, value):
        merged[keyword] = current * value // math.gcd(current, value)
    elif keyword == "uniqueItems":
        merged[keyword] = bool(current) or bool(value)
    elif keyword != "type":
        notes.append((keyword, "a second value in allOf"))


def _merge_nullable(
    merged: Schema, first: Schema, second: Schema, pointer: str, notes: list[tuple[str, str]]
) -> None:
    """``nullable: true`` lets null past its own object's ``type`` and applicators only, so
    merged it stays only where the other side admits null too: copied from one side,
    ``{"allOf": [{"type": "string", "nullable": true}, {"type": "string"}]}`` accepted null,
    which the second branch refuses. Where the other side's applicators decide, a nullable
    side without applicators of its own says null in its ``type`` instead; with applicators
    on both sides the null is left to the after-check (a note).

    Raises:
        SchemaError: a malformed ``type``.
    """
    nullable = [side.get("nullable") is True for side in (first, second)]
    merged.pop("nullable", None)
    if not any(nullable):
        return
    own, other = (first, second) if nullable[0] else (second, first)
    if all(nullable) or _admits_null_by_itself(other, pointer):
        merged["nullable"] = True
    elif not _type_admits_null(other, pointer):
        return  # null fails the other side's type: the merge refuses it, as the check does
    elif any(keyword in own for keyword in NULLABLE_APPLICATORS):
        merged["nullable"] = True
        notes.append(("nullable", "null passes one side's applicators, maybe not the other's"))
    elif "type" in own:
        widened = (type_set(own, pointer) or set()) | {"null"}
        merged["type"] = sorted(intersect_types(widened, type_set(other, pointer)) or [])


def _admits_null_by_itself(schema: Schema, pointer: str) -> bool:
    """Whether null passes ``schema``'s ``type`` and it has no applicator that could refuse
    it (its other keywords stay in the merge and apply to null there)."""
    applicators = any(keyword in schema for keyword in NULLABLE_APPLICATORS)
    return not applicators and _type_admits_null(schema, pointer)


def _type_admits_null(schema: Schema, pointer: str) -> bool:
    types = type_set(schema, pointer)
    return types is None or "null" in types


def _merge_boolean_exclusives(merged: Schema, first: Schema, second: Schema) -> None:
    """Draft 4's ``exclusiveMinimum: true`` qualifies its own schema's ``minimum``: merged,
    the tighter bound keeps its own flag (an equal bound is exclusive if either is), not the
    first schema's (``minimum`` 5 exclusive with ``minimum`` 6 refused 6)."""
    for bound, flag, tighter in (
        ("minimum", "exclusiveMinimum", 1),
        ("maximum", "exclusiveMaximum", -1),
    ):
        pairs = [
            (Decimal(str(schema[bound])), schema.get(flag) is True)
            for schema in (first, second)
            if _is_number(schema.get(bound))
        ]
        if not any(isinstance(schema.get(flag), bool) for schema in (first, second)):
            continue
        if not pairs:  # a flag without its bound says nothing
            merged.pop(flag, None)
            continue
        if len(pairs) == 1:
            merged[flag] = pairs[0][1]
            continue
        (left, left_open), (right, right_open) = pairs
        if left == right:
            merged[flag] = left_open or right_open
        else:
            merged[flag] = left_open if (left - right) * tighter > 0 else right_open


def _merge_branches(
    merged: Schema, keyword: str, value: list[Any], notes: list[tuple[str, str]]
) -> None:
    current = merged[keyword]
    if len(current) * len(value) > MAX_COMBINED_BRANCHES:
        notes.append((keyword, "a second anyOf/oneOf in allOf with too many combinations"))
        return
    merged[keyword] = [{"allOf": [left, right]} for left in current for right in value]
    if keyword == "oneOf":
        notes.append((keyword, "two oneOf in allOf: exclusivity checked after decoding"))


def _array_parts(schema: Schema) -> tuple[list[Any], Any]:
    """(positional item schemas, the schema of every later item) in either dialect;
    ``additionalItems`` without an ``items`` array constrains nothing."""
    if "prefixItems" in schema:
        if not isinstance(schema["prefixItems"], list):  # a $ref target the metaschema missed
            raise SchemaError("prefixItems must be an array", "", "prefixItems")
        return list(schema["prefixItems"]), schema.get("items", True)
    items = schema.get("items", True)
    if isinstance(items, list):
        return list(items), schema.get("additionalItems", True)
    return [], items


def _merge_array_keywords(first: Schema, second: Schema) -> Schema:
    """Item i of the merge obeys both sides' schema for position i (a side's "later items"
    schema covers positions past its own prefix): exact in both dialects."""
    first_prefix, first_rest = _array_parts(first)
    second_prefix, second_rest = _array_parts(second)
    length = max(len(first_prefix), len(second_prefix))
    prefix = []
    for index in range(length):
        left = first_prefix[index] if index < len(first_prefix) else first_rest
        right = second_prefix[index] if index < len(second_prefix) else second_rest
        prefix.append(_both(left, right))
    rest = _both(first_rest, second_rest)
    if not prefix:
        return {"items": rest}
    if "prefixItems" in first or "prefixItems" in second:
        return {"prefixItems": prefix, "items": rest}
    return {"items": prefix, "additionalItems": rest}


def _both(left: Any, right: Any) -> Any:
    if left is True or left == {}:
        return right
    if right is True or right == {}:
        return left
    return {"allOf": [left, right]}


def _merge_object_keywords(
    merged: Schema, first: Schema, second: Schema, notes: list[tuple[str, str]]
) -> None:
    """A property declared on one side only is also bound by the other side's
    ``additionalProperties`` (the classic allOf + additionalProperties: false trap), unless a
    ``patternProperties`` pattern of that side matches its name (then that pattern's schema
    binds it, in the merge too). A side's patterns that the other side lacks, beside that
    side's ``additionalProperties``, have no exact merge: the keys they match are checked
    after decoding (merged, they matched a pattern and passed where ``additionalProperties:
    false`` refused them)."""
    for own, other in ((first, second), (second, first)):
        extra = other.get("additionalProperties", True)
        if extra is True or extra == {}:
            continue
        names = other.get("properties", {})
        patterns = other.get("patternProperties", {})
        properties = dict(merged.get("properties", {}))
        for name in own.get("properties", {}):
            if name not in names and not any(is_pattern_match(p, name) for p in patterns):
                properties[name] = {"allOf": [properties[name], extra]}
        if properties:
            merged["properties"] = properties
        if any(pattern not in patterns for pattern in own.get("patternProperties", {})):
            notes.append(("additionalProperties", "beside the other allOf branch's patterns"))


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _are_integers(first: Any, second: Any) -> bool:
    return all(isinstance(value, int) and not isinstance(value, bool) for value in (first, second))


def json_equal(first: Any, second: Any) -> bool:
    """JSON equality: 1 == 1.0, but True != 1 and key order does not matter."""
    if isinstance(first, bool) or isinstance(second, bool):
        return type(first) is type(second) and first == second
    if isinstance(first, dict) and isinstance(second, dict):
        return first.keys() == second.keys() and all(
            json_equal(first[key], second[key]) for key in first
        )
    if isinstance(first, list) and isinstance(second, list):
        return len(first) == len(second) and all(
            json_equal(left, right) for left, right in zip(first, second, strict=True)
        )
    return bool(first == second)


def _json_in(item: Any, values: list[Any]) -> bool:
    return any(json_equal(item, value) for value in values)
