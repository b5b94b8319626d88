"""Resolving ``$ref``: the root schema's ``referencing`` resolver, made on first use and
crawled only where the schema names resources or anchors, and JSON pointers read in the root
without a lookup (:meth:`SchemaCompiler.resolve <formline.schema.compiler.SchemaCompiler>`).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urljoin

from jsonschema_specifications import REGISTRY as SPECIFICATIONS
from referencing import Resource

# Keywords that name a resource or an anchor by a string (draft 2019-09's "$recursiveAnchor"
# is a boolean and names nothing).
IDENTIFIER_KEYWORDS = frozenset(("$id", "$anchor", "$dynamicAnchor"))
# Draft 4's (and 3's) "id" names a resource only where a "$schema" names one of those drafts:
# referencing picks its rules by the dialect a resource declares, and reads "id" under no
# other. Counted everywhere, it bought schemas of other drafts a crawl that indexed nothing
# and sent every "#/..." reference through a lookup instead of the root pointer path
# (Github_hard o83846, no "$schema": schema-to-IR 4.35 -> 3.45 ms).
LEGACY_DIALECTS = ("draft-03/schema", "draft-04/schema")
# Keywords whose value is data, never a schema (a "$ref" or "pattern" key inside is data).
DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
# Keywords whose value maps names (not keywords) to subschemas.
NAME_MAPS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies"}
)


def has_identifiers(root: Any) -> bool:
    """Whether ``root`` holds a string under an identifier keyword anywhere but its own
    plain ``$id`` (a base URI without fragment, which the registry knows by then), or a
    string under ``id`` (but the root's plain one) where some ``$schema`` names draft 3 or 4.
    A ``$id`` holding a string inside ``const``, ``enum`` or ``examples`` counts too: it only
    costs the crawl (a property named ``$id`` holds a schema, not a string). Iterative;
    O(size of the schema), about 5 times faster than the crawl."""
    has_legacy_id = has_legacy_dialect = False
    pending = [root]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if isinstance(value, str):
                    if key in IDENTIFIER_KEYWORDS and (
                        node is not root or key != "$id" or "#" in value
                    ):
                        return True
                    if key == "id" and (node is not root or "#" in value):
                        has_legacy_id = True
                    elif key == "$schema" and any(name in value for name in LEGACY_DIALECTS):
                        has_legacy_dialect = True
                    if has_legacy_id and has_legacy_dialect:
                        return True
                elif isinstance(value, dict | list):
                    pending.append(value)
        elif isinstance(node, list):
            pending.extend(value for value in node if isinstance(value, dict | list))
    return False


def absolute_references(schema: Any, base: str) -> Any:
    """A copy of ``schema``, the resource read under ``base`` (its own ``$id`` already in
    it), whose ``$ref`` and ``$id`` strings are absolute URIs, so that it means the same
    wherever it is placed: an ``allOf`` branch's ``$ref`` target merged into its parent is
    compiled under the parent's base, where the target's ``"b.json"`` named another
    resource (the grammar wrote the wrong schema's values). Data (``const``, ``enum``,
    ``default``, ``examples``; a property of one of those names is a schema) is copied as
    it is. A ``urn:`` base is left as it is (``urljoin`` does not join under it).
    ``schema`` is not changed. Costs one walk of it."""
    return _absolute(schema, base, top=True)


def _absolute(schema: Any, base: str, top: bool = False) -> Any:
    if isinstance(schema, list):
        return [_absolute(item, base) for item in schema]
    if not isinstance(schema, dict):
        return schema
    identifier = schema.get("$id")
    if isinstance(identifier, str) and not top:  # the top's is in base already: joined
        base = urljoin(base, identifier)  # again, "sub/a.json" made sub/sub/a.json
    copy: dict[str, Any] = {}
    for key, value in schema.items():
        if key in DATA_KEYWORDS:
            copy[key] = value
        elif key in NAME_MAPS and isinstance(value, dict):
            copy[key] = {name: _absolute(sub, base) for name, sub in value.items()}
        elif key == "$id" and isinstance(value, str):
            copy[key] = base
        elif key == "$ref" and isinstance(value, str):
            copy[key] = urljoin(base, value)
        else:
            copy[key] = _absolute(value, base)
    return copy


def base_uri_of(root: Any) -> str:
    """The base URI references in ``root`` resolve against: its ``$id``, else empty."""
    base = root.get("$id", "") if isinstance(root, dict) else ""
    return base if isinstance(base, str) else ""


def resolver_of(root: Any, specification: Any, is_crawled: bool) -> Any:
    """``root``'s resolver; ``is_crawled``: index its embedded resources and anchors first.
    Without any, a reference resolves in the root (by JSON pointer) or in a meta-schema,
    both in the registry already; and a lookup that misses crawls on its own (referencing's
    ``get_or_retrieve``), so an unresolvable reference still fails."""
    base = base_uri_of(root)
    resource = Resource.from_contents(root, default_specification=specification)
    registry = SPECIFICATIONS.with_resource(base, resource)
    return (registry.crawl() if is_crawled else registry).resolver(base)


def pointer_target(document: Any, fragment: str) -> Any:
    """The value at JSON pointer ``fragment`` (percent-encoded, as in a ``$ref``) of
    ``document``, read as ``referencing`` reads it. Raises ``LookupError``, ``ValueError``
    or ``TypeError`` where the pointer leads nowhere. Costs O(length of the pointer)."""
    if not fragment:
        return document
    target = document
    for segment in unquote(fragment[1:]).split("/"):
        if isinstance(target, list | str):
            target = target[int(segment)]
        else:
            target = target[segment.replace("~1", "/").replace("~0", "~")]
    return target


class LazyResolver:
    """The root schema's resolver, made on first use (three of four MaskBench schemas have
    no ``$ref`` and never need it) and crawled only where :func:`has_identifiers`."""

    def __init__(self, root: Any, specification: Any):
        self._root = root
        self._specification = specification
        self._resolver: Any = None
        self._has_identifiers: bool | None = None
        self.base_uri = base_uri_of(root)

    def has_identifiers(self) -> bool:
        """:func:`has_identifiers` of the root, found once."""
        if self._has_identifiers is None:
            self._has_identifiers = has_identifiers(self._root)
        return self._has_identifiers

    def _get(self) -> Any:
        if self._resolver is None:
            crawled = self.has_identifiers()
            self._resolver = resolver_of(self._root, self._specification, crawled)
        return self._resolver

    def lookup(self, reference: str) -> Any:
        """See ``referencing``'s ``Resolver.lookup``."""
        return self._get().lookup(reference)

    def in_subresource(self, subresource: Any) -> Any:
        """See ``referencing``'s ``Resolver.in_subresource``."""
        return self._get().in_subresource(subresource)
