"""Write a value the way the grammar writes it: object keys in the schema's declared order.

The grammar fixes property order (the schema's order is the model's reasoning order), so a
valid value whose keys come in another order is the same value in a text the grammar does
not produce. :func:`order_like_schema` reorders keys (declared properties first, in schema
order, then the other keys as they were) following the same ``$ref``/``allOf``/``anyOf``
paths as the compiler; the value itself is unchanged.
"""

from __future__ import annotations

from typing import Any

from formline.schema.merge import as_object, json_equal, merge
from formline.schema.objects import member_schema

MAX_DEPTH = 64


def order_like_schema(
    schema: Any, instance: Any, resolver: Any, validator: Any, is_draft7: bool = False
) -> Any:
    """``instance`` with every object's keys in the order the grammar writes them.

    ``resolver`` is a ``referencing`` resolver of the root schema and ``validator`` a
    ``jsonschema`` validator of it (used to pick the ``anyOf``/``oneOf`` branch that holds).
    Costs O(size of instance x depth of references).
    """
    return _Orderer(validator, is_draft7).order(schema, instance, resolver, 0)


class _Orderer:
    def __init__(self, validator: Any, is_draft7: bool):
        self.validator = validator
        self.is_draft7 = is_draft7

    def order(self, schema: Any, instance: Any, resolver: Any, depth: int) -> Any:
        if depth > MAX_DEPTH or not isinstance(schema, dict):
            return instance
        schema, resolver = self.flatten(schema, resolver, depth)
        if isinstance(instance, dict | list):
            # A const/enum literal is written as the schema writes it, at every depth
            # (only a top-level object was: {"x": {"a": 2, "b": 1}} kept its own order).
            for value in schema.get("enum", [schema["const"]] if "const" in schema else []):
                if json_equal(value, instance):
                    return _like(value, instance)
        for keyword in ("anyOf", "oneOf"):
            if keyword in schema:
                rest = {key: value for key, value in schema.items() if key != keyword}
                for branch in schema[keyword]:
                    combined = {"allOf": [rest, branch]} if rest else branch
                    if self.holds(combined, instance):
                        return self.order(combined, instance, resolver, depth + 1)
                return instance
        if isinstance(instance, dict):
            return self.order_object(schema, instance, resolver, depth)
        if isinstance(instance, list):
            return self.order_array(schema, instance, resolver, depth)
        return instance

    def flatten(self, schema: dict[str, Any], resolver: Any, depth: int) -> tuple[Any, Any]:
        """Follow ``$ref`` and merge ``allOf`` as the compiler does."""
        for _ in range(MAX_DEPTH - depth):
            if "$ref" in schema:
                resolved = resolver.lookup(schema["$ref"])
                rest = {key: value for key, value in schema.items() if key != "$ref"}
                if "allOf" in rest and not self.is_draft7:
                    # The siblings' allOf before the target, as the compiler merges them:
                    # merged after it, {"$ref": T, "allOf": [B]} wrote T's keys first.
                    rest, _ = self.flatten(rest, resolver, depth + 1)
                target = as_object(resolved.contents, "")
                # 2020-12: siblings apply and come first (as the compiler merges them);
                # draft 7 ignores them.
                schema = merge(rest, dict(target), "")[0] if rest and not self.is_draft7 else target
                resolver = resolved.resolver
            elif "allOf" in schema:
                merged = {key: value for key, value in schema.items() if key != "allOf"}
                for branch in schema["allOf"]:
                    branch, resolver = self.flatten(as_object(branch, ""), resolver, depth + 1)
                    merged = merge(merged, branch, "")[0]
                schema = merged
            else:
                break
        return schema, resolver

    def holds(self, schema: Any, instance: Any) -> bool:
        try:
            return bool(self.validator.evolve(schema=schema).is_valid(instance))
        except Exception:  # an unresolvable reference inside a branch: try the next one
            return False

    def order_object(
        self, schema: dict[str, Any], instance: dict[str, Any], resolver: Any, depth: int
    ) -> dict[str, Any]:
        properties = schema.get("properties", {})
        declared = list(properties) + [
            name for name in schema.get("required", []) if name not in properties
        ]
        keys = [key for key in declared if key in instance]
        keys += [key for key in instance if key not in keys]
        result = {}
        for key in keys:
            result[key] = self.order(member_schema(schema, key), instance[key], resolver, depth + 1)
        return result

    def order_array(
        self, schema: dict[str, Any], instance: list[Any], resolver: Any, depth: int
    ) -> list[Any]:
        prefix = schema.get("prefixItems", [])
        items = schema.get("items", True)
        if isinstance(items, list):
            prefix, items = items, schema.get("additionalItems", True)
        return [
            self.order(prefix[index] if index < len(prefix) else items, item, resolver, depth + 1)
            for index, item in enumerate(instance)
        ]


def _like(literal: Any, instance: Any) -> Any:
    """``instance`` (JSON-equal to ``literal``) with every object's keys in ``literal``'s
    order."""
    if isinstance(literal, dict) and isinstance(instance, dict):
        return {key: _like(literal[key], instance[key]) for key in literal}
    if isinstance(literal, list) and isinstance(instance, list):
        return [_like(left, right) for left, right in zip(literal, instance, strict=True)]
    return instance
