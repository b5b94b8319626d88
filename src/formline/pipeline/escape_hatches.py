"""Escape hatches: give the model somewhere to go when the text does not hold the answer.

Seed 000's contract job returned a number for "notice as per Annex II" because the field was a
required integer and the model had no other place to go; its ticket enum forced a security
report into the least wrong category. These helpers rewrite a JSON Schema dict so that a
missing value can be written as ``null`` (:func:`make_nullable`) and a closed set of labels
gets an explicit ``"other"`` with a free-text reason (:func:`add_other_option`).

A field path is the property names from the root joined by dots (``"notice_days"``,
``"items.unit_price"``, ``"action.user_id"``). Arrays are crossed implicitly (``items`` names
the array and ``items.unit_price`` the property of each of its items; the grounding form
``items[].unit_price`` is accepted too, as is an index, which is ignored), and so are local
``$ref`` s and the branches of ``anyOf`` / ``oneOf`` / ``allOf``: a path names every place it
reaches. A ``$ref`` on the way to a changed field is replaced by a copy of its target, so a
definition shared with other fields is never changed behind their back.

Both helpers return a new schema and never modify their argument.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Iterator
from typing import Any

from jsonschema import Draft202012Validator
from referencing.exceptions import Unresolvable

from formline.schema.python_patterns import with_python_patterns
from formline.schema.report import SchemaError

SCALAR_TYPES = frozenset({"string", "integer", "number", "boolean"})
BRANCH_KEYWORDS = ("anyOf", "oneOf", "allOf")
ANNOTATIONS = ("title", "description", "default", "examples")
# Keywords whose subschemas (or values) judge a null on their own: a field with one is
# wrapped in anyOf rather than given "null" in its "type".
BESIDE_TYPE = frozenset(
    {"const", "$ref", "$dynamicRef", "allOf", "anyOf", "oneOf", "not", "if", "then", "else"}
)
OTHER = "other"
DEFAULT_REASON_FIELD = "{field}_other"
REASON_DESCRIPTION = "Only when {field} is 'other': what it is instead, in a few words."

Slot = tuple[dict[str, Any], str]  # a properties dict and one of its keys
# An object schema (the node holding "properties") and one of its property names.
HeldSlot = tuple[dict[str, Any], str]


def make_nullable(schema: dict[str, Any], field_paths: Iterable[str]) -> dict[str, Any]:
    """A copy of ``schema`` where each field in ``field_paths`` also accepts ``null``.

    A ``type`` becomes ``[type, "null"]`` (a list gains ``"null"``) and an ``enum`` gains
    ``None``; a field without a plain ``type`` (``$ref``, ``anyOf``, ``const``, ...) is
    wrapped as ``{"anyOf": [field, {"type": "null"}]}`` (an existing ``anyOf`` gains the
    null branch), its annotations kept outside. A required field stays required: the key
    must be written, its value may be null.

    Raises:
        SchemaError: a path that names no property of the schema.
    Costs one deep copy of the schema.
    """
    result = copy.deepcopy(schema)
    for path in field_paths:
        for properties, name in _slots(result, path):
            properties[name] = _nullable(properties[name])
    return result


def add_other_option(
    schema: dict[str, Any],
    field_paths: Iterable[str],
    reason_field: str = DEFAULT_REASON_FIELD,
) -> dict[str, Any]:
    """A copy of ``schema`` where each string-enum field in ``field_paths`` also accepts
    ``"other"``, followed (in property order) by an optional free-text property named
    ``reason_field.format(field=name)`` (default ``<field>_other``) for what it is instead.

    Raises:
        SchemaError: a path that names no property, a field that is not a string enum, or
            a reason property whose name is already taken.
    Costs one deep copy of the schema.
    """
    result = copy.deepcopy(schema)
    for path in field_paths:
        for holder, name in _held_slots(result, path):
            properties = holder["properties"]
            field_schema = _inline(result, properties[name])
            if not is_string_enum(field_schema):
                raise SchemaError(f"field {path!r} is not a string enum: cannot add 'other'")
            reason = reason_field.format(field=name)
            if reason in properties:
                raise SchemaError(f"field {path!r}: the reason property {reason!r} exists")
            properties[name] = _with_other(field_schema)
            _insert_after(properties, name, reason, _reason_schema(name))
            _admit_name(holder, reason, path)
    return result


def _admit_name(holder: dict[str, Any], reason: str, path: str) -> None:
    """Let the object ``holder`` hold the added property ``reason``: a ``propertyNames``
    that refuses it gains it as a ``const`` branch (before, the grammar and the after-check
    refused the key the hatch had asked for, silently).

    Raises:
        SchemaError: a ``patternProperties`` pattern matches ``reason`` and its schema
            refuses a free-text reason.
    """
    names = holder.get("propertyNames")
    if names is not None and not _is_valid(names, reason):
        holder["propertyNames"] = {"anyOf": [names, {"const": reason}]}
    for pattern, judge in (holder.get("patternProperties") or {}).items():
        try:
            matches = re.search(pattern, reason) is not None
        except re.error:  # an ECMA-only pattern: the compiler names it
            continue
        # One whose schema takes a free-text reason ({} or {"type": "string"}: a catch-all
        # ".*") is no obstacle; it raised for every schema with one.
        if matches and not _is_valid(judge, "what it is instead"):
            raise SchemaError(
                f"field {path!r}: the reason property {reason!r} matches patternProperties "
                f"{pattern!r}; name it otherwise (reason_field)"
            )


def _is_valid(subschema: Any, value: Any) -> bool:
    """Whether ``subschema`` (read alone: a ``$ref`` in it counts as refusing) takes ``value``."""
    try:
        return bool(Draft202012Validator(with_python_patterns(subschema)[0]).is_valid(value))
    except (Unresolvable, RecursionError, ValueError, re.error):
        return False


def hatch_fields(schema: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The field paths ``escape_hatches=True`` changes: every required scalar field (not a
    ``const``) to make nullable, and every string-enum field to give an ``"other"``.
    Costs one walk of the schema."""
    nullable: list[str] = []
    enums: list[str] = []
    for path, field_schema, required in _fields(schema, schema, "", frozenset()):
        resolved = follow_reference(schema, field_schema)
        if is_string_enum(resolved):
            enums.append(path)
        if required and _is_scalar(resolved) and "const" not in resolved:
            nullable.append(path)
    return list(dict.fromkeys(nullable)), list(dict.fromkeys(enums))


def apply_escape_hatches(schema: dict[str, Any], fields: bool | Iterable[str]) -> dict[str, Any]:
    """``schema`` with the hatches of ``extract(..., escape_hatches=fields)``: ``True`` gives
    every string enum an ``"other"`` and makes every required scalar nullable; an iterable
    of paths gives those fields an ``"other"`` (when they are string enums) and makes them
    nullable; ``False`` returns ``schema`` itself.

    Raises:
        SchemaError: a path that names no property of the schema.
    """
    if fields is False:
        return schema
    if fields is True:
        nullable, enums = hatch_fields(schema)
    else:
        nullable = list(fields)
        enums = [path for path in nullable if _all_string_enums(schema, path)]
    return make_nullable(add_other_option(schema, enums), nullable)


def is_string_enum(field_schema: Any) -> bool:
    """Whether ``field_schema`` is an ``enum`` of strings (nulls allowed besides)."""
    if not isinstance(field_schema, dict) or not isinstance(field_schema.get("enum"), list):
        return False
    values = [value for value in field_schema["enum"] if value is not None]
    return bool(values) and all(isinstance(value, str) for value in values)


def _all_string_enums(root: dict[str, Any], path: str) -> bool:
    return all(
        is_string_enum(follow_reference(root, properties[name]))
        for properties, name in _slots(copy.deepcopy(root), path)
    )


def _is_scalar(field_schema: dict[str, Any]) -> bool:
    kinds = field_schema.get("type")
    if isinstance(kinds, str):
        return kinds in SCALAR_TYPES
    if isinstance(kinds, list):
        named = [kind for kind in kinds if kind != "null"]
        return bool(named) and all(kind in SCALAR_TYPES for kind in named)
    return "enum" in field_schema


def _nullable(field_schema: Any) -> Any:
    if not isinstance(field_schema, dict):  # a boolean schema
        return {"anyOf": [field_schema, {"type": "null"}]}
    result = dict(field_schema)
    kinds = result.get("type")
    # Beside an applicator (an allOf branch with its own type, a $ref) a null in "type"
    # still failed the branch: only a field without one is widened in place.
    if isinstance(kinds, str | list) and not set(result) & BESIDE_TYPE:
        listed = [kinds] if isinstance(kinds, str) else list(kinds)
        result["type"] = listed if "null" in listed else [*listed, "null"]
        if isinstance(result.get("enum"), list) and None not in result["enum"]:
            result["enum"] = [*result["enum"], None]
        return result
    if set(result) - set(ANNOTATIONS) == {"anyOf"}:
        if {"type": "null"} not in result["anyOf"]:
            result["anyOf"] = [*result["anyOf"], {"type": "null"}]
        return result
    kept = {key: result.pop(key) for key in ANNOTATIONS if key in result}
    return {**kept, "anyOf": [result, {"type": "null"}]}


def _with_other(field_schema: dict[str, Any]) -> dict[str, Any]:
    """The string enum ``field_schema`` with ``"other"`` among its values; where its other
    keywords refuse ``"other"`` (a ``maxLength`` of 3, a ``pattern``), ``"other"`` is an
    ``anyOf`` branch of its own, the field's annotations kept outside."""
    if OTHER in field_schema["enum"]:
        return field_schema
    widened = {**field_schema, "enum": [*field_schema["enum"], OTHER]}
    # A $ref inside the field (an allOf's) names the root, not this field: read as refusing,
    # "other" gets a branch of its own, taken whatever the reference says.
    if _is_valid(widened, OTHER):
        return widened
    kept = {key: field_schema[key] for key in ANNOTATIONS if key in field_schema}
    rest = {key: value for key, value in field_schema.items() if key not in kept}
    return {**kept, "anyOf": [rest, {"const": OTHER}]}


def _reason_schema(field: str) -> dict[str, Any]:
    return {"type": "string", "description": REASON_DESCRIPTION.format(field=field)}


def _insert_after(properties: dict[str, Any], anchor: str, key: str, value: Any) -> None:
    items = list(properties.items())
    properties.clear()
    for name, entry in items:
        properties[name] = entry
        if name == anchor:
            properties[key] = value


def _slots(root: dict[str, Any], path: str) -> list[Slot]:
    """Every (properties dict, name) that ``path`` reaches inside ``root`` (a copy we may
    change: the ``$ref`` s on the way are inlined)."""
    return [(holder["properties"], name) for holder, name in _held_slots(root, path)]


def _held_slots(root: dict[str, Any], path: str) -> list[HeldSlot]:
    """:func:`_slots` with each properties dict's object schema in its place."""
    names = [name for name in re.sub(r"\[[0-9]*\]", "", path).split(".") if name]
    if not names:
        raise SchemaError(f"empty field path {path!r}")
    holders = [root]
    found: list[HeldSlot] = []
    for depth, name in enumerate(names):
        found = [
            (objects, name)
            for holder in holders
            for objects in _property_holders(root, holder)
            if name in objects["properties"]
        ]
        if not found:
            raise SchemaError(f"no field {path!r} in the schema (at {name!r})")
        if depth < len(names) - 1:
            holders = []
            for objects, key in found:
                properties = objects["properties"]
                properties[key] = _inline(root, properties[key])
                holders.append(properties[key])
    return found


def _property_holders(
    root: dict[str, Any], node: Any, visiting: frozenset[str] = frozenset()
) -> Iterator[dict[str, Any]]:
    """The object schemas with a ``properties`` dict in ``node``, crossing arrays, ``$ref`` s
    (inlined in place, once per reference on the way) and the branches of ``anyOf`` /
    ``oneOf`` / ``allOf``."""
    if not isinstance(node, dict):
        return
    if "$ref" in node:
        if node["$ref"] in visiting:  # a recursive schema: stop at the cycle
            return
        visiting = visiting | {node["$ref"]}
        inlined = _inline(root, node)
        node.clear()
        node.update(inlined)
    if isinstance(node.get("properties"), dict):
        yield node
    if isinstance(node.get("items"), dict):
        yield from _property_holders(root, node["items"], visiting)
    for keyword in BRANCH_KEYWORDS:
        branches = node.get(keyword)
        for branch in branches if isinstance(branches, list) else []:
            yield from _property_holders(root, branch, visiting)


def _inline(root: dict[str, Any], node: Any) -> Any:
    """``node`` with its local ``$ref`` replaced by a copy of the target (siblings kept)."""
    if not isinstance(node, dict) or "$ref" not in node:
        return node
    siblings = {key: value for key, value in node.items() if key != "$ref"}
    target = copy.deepcopy(_resolve_pointer(root, node["$ref"]))
    if not isinstance(target, dict):
        return {"allOf": [target], **siblings}
    for key in ("$schema", "$id", "$defs", "definitions"):
        target.pop(key, None)
    return _inline(root, {**target, **siblings})


def follow_reference(root: dict[str, Any], node: Any) -> Any:
    """``node`` with its local ``$ref`` followed (siblings kept; for reading only).

    Raises:
        SchemaError: a ``$ref`` that is not local or does not resolve.
    """
    seen: set[str] = set()
    while isinstance(node, dict) and "$ref" in node and node["$ref"] not in seen:
        seen.add(node["$ref"])
        siblings = {key: value for key, value in node.items() if key != "$ref"}
        target = _resolve_pointer(root, node["$ref"])
        node = {**target, **siblings} if isinstance(target, dict) else target
    return node


def _resolve_pointer(root: dict[str, Any], reference: str) -> Any:
    if not reference.startswith("#"):
        raise SchemaError(f"only local $ref are supported by escape hatches: {reference!r}")
    node: Any = root
    for part in reference[1:].split("/")[1:]:
        key = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, list) and key.isdigit():
            node = node[int(key)]
        elif isinstance(node, dict) and key in node:
            node = node[key]
        else:
            raise SchemaError(f"$ref {reference!r} does not resolve")
    return node


def _fields(
    root: dict[str, Any], node: Any, prefix: str, visiting: frozenset[str]
) -> Iterator[tuple[str, Any, bool]]:
    """(path, field schema, required) for every property reachable from ``node``."""
    if not isinstance(node, dict):
        return
    if "$ref" in node:
        reference = node["$ref"]
        if reference in visiting:  # a recursive schema: stop at the cycle
            return
        visiting = visiting | {reference}
        node = follow_reference(root, node)
        if not isinstance(node, dict):
            return
    required = set(node.get("required", []))
    for name, field_schema in (node.get("properties") or {}).items():
        path = f"{prefix}.{name}" if prefix else name
        yield path, field_schema, name in required
        yield from _fields(root, field_schema, path, visiting)
    if isinstance(node.get("items"), dict):
        yield from _fields(root, node["items"], prefix, visiting)
    for keyword in BRANCH_KEYWORDS:
        branches = node.get(keyword)
        for branch in branches if isinstance(branches, list) else []:
            yield from _fields(root, branch, prefix, visiting)
