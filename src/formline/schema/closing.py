"""vLLM/xgrammar's default for open objects: ``additionalProperties: false``, only where it
provably narrows.

xgrammar (vLLM's default structured-output backend) compiles JSON Schemas in strict mode:
an object schema that lists ``properties`` and says nothing about other keys gets no other
keys. Clients written against vLLM rely on it (a Pydantic ``model_json_schema()`` leaves
objects open; decoded under an open schema, a small model adds keys such as ``"title"``).
``formline serve`` applies the same default so such clients get the same objects.

Closing must never let through a value the client's schema refuses, so it happens only at
*narrowing* positions, where a narrower subschema makes the whole schema narrower: the root,
``properties`` / ``patternProperties`` / ``additionalProperties`` values, ``items``,
``prefixItems``, ``additionalItems``, the branches of ``anyOf`` and ``allOf``, and the root's
``$defs`` / ``definitions`` entries whose every ``$ref`` sits at such a position. Never under
``oneOf``, ``not``, ``if`` / ``then`` / ``else``, ``dependentSchemas``, ``dependencies``,
``contains``, ``propertyNames`` or ``unevaluated*`` (closing a ``oneOf`` branch can make a
value that matched two branches match one, which ``oneOf`` then accepts). A ``$ref`` of
another form (``#``, an anchor, another document) under such a keyword leaves the whole
schema unclosed. The server's after-check validates against the original schema too.

Not closed, to keep what siblings contribute: an object with ``additionalProperties``,
``patternProperties``, ``unevaluatedProperties``, an applicator (``allOf``, ``anyOf``,
``oneOf``, ``if``, ``dependentSchemas``, ...) or a ``$ref`` beside its properties; the top
of an ``allOf`` branch, of an ``anyOf`` branch beside ``properties``, and of a ``$defs``
entry referenced beside ``properties``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

OPEN, INNER, FULL = 0, 1, 2  # close nothing / close below the top / close the top too
NARROWING_SINGLES = ("items", "additionalProperties", "additionalItems")
NARROWING_MAPS = ("properties", "patternProperties")
NARROWING_LISTS = ("prefixItems", "items", "anyOf", "allOf")
OPEN_SINGLES = (
    "not", "if", "then", "else", "contains", "propertyNames", "unevaluatedItems",
    "unevaluatedProperties",
)  # fmt: skip
OPEN_MAPS = ("dependentSchemas", "dependencies")
OPEN_LISTS = ("oneOf",)
DEFINITIONS = ("$defs", "definitions")
REFERENCES = ("$ref", "$dynamicRef", "$recursiveRef")
# Keywords beside ``properties`` that may let other keys in: the object stays open.
CONTRIBUTORS = (
    "properties", "additionalProperties", "patternProperties", "unevaluatedProperties",
    "allOf", "anyOf", "oneOf", "if", "then", "else", "dependentSchemas", "dependencies",
)  # fmt: skip
OPENERS = (*CONTRIBUTORS[1:], *REFERENCES)


def close_objects(schema: Any) -> Any:
    """A copy of ``schema`` whose open object schemas at narrowing positions are closed (see
    the module's doc): every value the copy accepts, ``schema`` accepts.

    Costs two walks over the schema (plus one walk of each ``$defs`` entry per level it is
    referenced at, at most three); the input is not changed.
    """
    if not isinstance(schema, dict):
        return schema
    uses: dict[str, int] = {}
    if not _collect(schema, FULL, schema, uses):
        return schema
    closed = _close(schema, FULL)
    for key in DEFINITIONS:
        definitions = schema.get(key)
        if isinstance(definitions, dict):
            closed[key] = {
                name: _close(body, uses.get(_pointer(key, name), OPEN))
                for name, body in definitions.items()
            }
    return closed


def _children(node: dict[str, Any], level: int) -> Iterator[tuple[str, Any, Any, int]]:
    """Each subschema of ``node`` (not its ``$defs``): ``(keyword, name or index or None,
    subschema, the level it may be closed at)``."""
    narrowing = FULL if level != OPEN else OPEN
    for key, value in node.items():
        if key in NARROWING_SINGLES and isinstance(value, dict):
            yield key, None, value, narrowing
        elif key in OPEN_SINGLES and isinstance(value, dict):
            yield key, None, value, OPEN
        elif key in NARROWING_MAPS + OPEN_MAPS and isinstance(value, dict):
            child = narrowing if key in NARROWING_MAPS else OPEN
            for name, sub in value.items():
                if isinstance(sub, dict):
                    yield key, name, sub, child
        elif key in NARROWING_LISTS + OPEN_LISTS and isinstance(value, list):
            child = _branch_level(node, key, narrowing)
            for index, sub in enumerate(value):
                if isinstance(sub, dict):
                    yield key, index, sub, child


def _branch_level(node: dict[str, Any], key: str, narrowing: int) -> int:
    """The level of a list keyword's entries: ``oneOf`` never; the top of an ``allOf``
    branch, or of an ``anyOf`` branch beside ``properties``, not (siblings add keys)."""
    if key in OPEN_LISTS or narrowing == OPEN:
        return OPEN
    if key == "allOf" or (key == "anyOf" and "properties" in node):
        return INNER
    return narrowing


def _collect(node: dict[str, Any], level: int, root: dict[str, Any], uses: dict[str, int]) -> bool:
    """Record in ``uses`` the lowest level each root ``$defs`` entry is referenced at
    (walking an entry again when its level drops). ``False``: a reference of another form
    sits at a position that must stay open, so nothing may be closed."""
    for key in REFERENCES:
        target = node.get(key)
        if not isinstance(target, str):
            continue
        entry = _definition_of(target)
        if entry is None:
            if level == OPEN:  # "#", an anchor, another document: it may reach a closed one
                return False
            continue
        beside = any(k in node for k in CONTRIBUTORS)
        at = INNER if level == FULL and beside else level
        if entry in uses and uses[entry] <= at:
            continue
        uses[entry] = at
        body = _resolve(root, entry)
        if isinstance(body, dict) and not _collect(body, at, root, uses):
            return False
    for _, _, sub, child in _children(node, level):
        if not _collect(sub, child, root, uses):
            return False
    for key in DEFINITIONS:  # nested definitions: only reached through a pointer, left open
        nested = node.get(key)
        if node is not root and isinstance(nested, dict):
            for sub in nested.values():
                if isinstance(sub, dict) and not _collect(sub, OPEN, root, uses):
                    return False
    return True


def _definition_of(target: str) -> str | None:
    """``"$defs/NAME"`` for a reference ``#/$defs/NAME`` (or into it), else ``None``."""
    if not target.startswith("#/"):
        return None
    parts = target[2:].split("/")
    if len(parts) < 2 or parts[0] not in DEFINITIONS:
        return None
    name = unquote(parts[1]).replace("~1", "/").replace("~0", "~")
    return _pointer(parts[0], name)


def _pointer(key: str, name: str) -> str:
    return f"{key}/{name}"


def _resolve(root: dict[str, Any], entry: str) -> Any:
    key, name = entry.split("/", 1)
    definitions = root.get(key)
    return definitions.get(name) if isinstance(definitions, dict) else None


def _close(node: Any, level: int) -> Any:
    """A copy of ``node`` closed at ``level`` (its root ``$defs`` are done by the caller)."""
    if not isinstance(node, dict) or level == OPEN:
        return node
    closed = dict(node)
    rebuilt: dict[str, Any] = {}
    for key, name, sub, child in _children(node, level):
        done = _close(sub, child)
        if name is None:
            closed[key] = done
        else:
            rebuilt.setdefault(key, type(node[key])(node[key]))[name] = done
    closed.update(rebuilt)
    if level == FULL and "properties" in node and not any(key in node for key in OPENERS):
        closed["additionalProperties"] = False
    return closed
