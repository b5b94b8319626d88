"""``$ref`` resolution (``schema/resolving.py``): the root's resolver is crawled only when
the schema names resources or anchors, and a JSON pointer into the root is read without a
``referencing`` lookup. Both must resolve what ``referencing`` resolves: the pointers
against its lookup, and the grammars and reports of the MaskBench sample's schemas with a
``$ref`` against the compile that looks every reference up."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from referencing.jsonschema import DRAFT202012

from formline.grammar import GrammarError
from formline.parser.pushdown import build_pushdown
from formline.schema import SchemaError, resolving, schema_to_grammar
from formline.schema.compiler import SchemaCompiler, SchemaOptions
from formline.schema.resolving import has_identifiers, pointer_target, resolver_of

MASKBENCH = Path(__file__).resolve().parents[1] / "data" / "maskbench"
DRAFT4 = "http://json-schema.org/draft-04/schema#"


def accepts_under(schema: Any) -> Any:
    automaton = build_pushdown(schema_to_grammar(schema)[0])
    return lambda value: automaton.matches(json.dumps(value, separators=(",", ":")).encode())


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"$defs": {"a": {"type": "string"}}, "$ref": "#/$defs/a"}, False),
        ({"$id": "https://example.com/root.json", "items": {"$ref": "#/$defs/a"}}, False),
        ({"properties": {"id": {"type": "string"}}}, False),  # a schema under "id"
        ({"$defs": {"a": {"$id": "item.json"}}}, True),
        ({"$defs": {"a": {"$anchor": "item"}}}, True),
        ({"$anchor": "root"}, True),
        ({"$id": "#root"}, True),  # draft 7's plain-name fragment: an anchor
        # Draft 4's "id" names a resource only under a draft 3 or 4 "$schema".
        ({"definitions": {"a": {"id": "item.json"}}}, False),
        ({"definitions": {"a": {"id": "#/definitions/a"}}}, False),
        ({"$schema": DRAFT4, "definitions": {"a": {"id": "item.json"}}}, True),
        ({"$schema": DRAFT4, "id": "http://example.com/root.json"}, False),
        ({"definitions": {"a": {"$schema": DRAFT4, "id": "item.json"}}}, True),
        ({"anyOf": [{"$dynamicAnchor": "node"}]}, True),
        ({"const": {"$id": "x"}}, True),  # not an identifier, but only costs the crawl
    ],
)
def test_only_schemas_with_identifiers_are_crawled(schema: Any, expected: bool) -> None:
    assert has_identifiers(schema) is expected


def test_a_draft_4_id_sets_the_base_of_the_references_below_it() -> None:
    # Under draft 4, "#/definitions/b" inside the resource "a.json" is a.json's own "b" (a
    # string); read in the root it would be the root's (an integer). Without a "$schema",
    # the schema is read as 2020-12, where "id" names nothing: the root's "b".
    def schema(dialect: dict[str, str]) -> dict[str, Any]:
        return {
            **dialect,
            "properties": {"x": {"$ref": "#/definitions/a"}},
            "definitions": {
                "b": {"type": "integer"},
                "a": {
                    "id": "http://example.com/a.json",
                    "properties": {"y": {"$ref": "#/definitions/b"}},
                    "definitions": {"b": {"type": "string"}},
                },
            },
        }

    draft4 = accepts_under(schema({"$schema": DRAFT4}))
    assert draft4({"x": {"y": "text"}}) and not draft4({"x": {"y": 1}})
    unversioned = accepts_under(schema({}))
    assert unversioned({"x": {"y": 1}}) and not unversioned({"x": {"y": "text"}})


def test_references_resolve_with_and_without_the_crawl() -> None:
    # No identifier: the root and the meta-schemas are in the registry uncrawled.
    # The meta-schema's own "#/definitions/..." are read in the meta-schema, not in the
    # root, which has a definition of the same name.
    plain = {
        "$defs": {"name": {"type": "string", "maxLength": 3}},
        "definitions": {"nonNegativeInteger": {"type": "string"}},
        "properties": {
            "name": {"$ref": "#/$defs/name"},
            "schema": {"$ref": "http://json-schema.org/draft-07/schema#"},
            "count": {"$ref": "#/definitions/nonNegativeInteger"},
        },
        "required": ["name"],
    }
    accepts = accepts_under(plain)
    assert accepts({"name": "Ada", "schema": {"maxLength": 5, "type": "string"}})
    assert accepts({"name": "Ada", "count": "five"})
    assert not accepts({"name": "Ada", "schema": {"maxLength": "five"}})
    assert not accepts({"name": "Ada Lovelace"})
    # An embedded resource and an anchor, named by URI: found by the crawl.
    named = {
        "$id": "https://example.com/root.json",
        "$defs": {
            "age": {"$id": "age.json", "type": "integer", "minimum": 0},
            "city": {"$anchor": "city", "type": "string", "maxLength": 4},
        },
        "properties": {"age": {"$ref": "age.json"}, "city": {"$ref": "#city"}},
    }
    accepts = accepts_under(named)
    assert accepts({"age": 36, "city": "Rome"})
    assert not accepts({"age": -1})
    assert not accepts({"city": "London"})
    with pytest.raises(SchemaError, match="does not resolve"):
        schema_to_grammar({"properties": {"a": {"$ref": "other.json#/a"}}})
    # "#bc" names an anchor (there is none), not a pointer: the root's key "c" is not it.
    with pytest.raises(SchemaError, match="does not resolve"):
        schema_to_grammar({"c": {"type": "string"}, "properties": {"a": {"$ref": "#bc"}}})


def test_pointers_read_in_the_root_equal_referencings_lookup() -> None:
    document = {"a/b": {"c~d": [10, {"e f": 5}]}, "$defs": {"x": {"type": "string"}}, "%25": 1}
    resolver = resolver_of(document, DRAFT202012, is_crawled=False)
    for reference in ("#", "#/$defs/x", "#/a~1b/c~0d/1/e%20f", "#/a~1b/c~0d/0", "#/%2525"):
        assert pointer_target(document, reference[1:]) == resolver.lookup(reference).contents
    for reference in ("#/missing", "#/a~1b/c~0d/7", "#/a~1b/c~0d/x", "#/%25/0"):
        with pytest.raises((LookupError, ValueError, TypeError)):
            pointer_target(document, reference[1:])
        with pytest.raises(Exception):  # noqa: B017 - referencing's own error types
            resolver.lookup(reference)


def compile_all(schema: Any) -> Any:
    """The grammar and report of ``schema``, or its error."""
    try:
        compiler = SchemaCompiler(schema, SchemaOptions())
        grammar = compiler.grammar()
    except (SchemaError, GrammarError) as error:
        return ("error", str(error))
    return grammar.rules, grammar.start, grammar.called_rules, repr(vars(compiler.report))


def test_sample_schemas_compile_alike_with_and_without_root_pointers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Against the compile before these shortcuts: every reference looked up in a crawled
    # registry.
    schemas = [
        json.loads(path.read_text())["schema"]
        for path in sorted(MASKBENCH.glob("*.json"))
        if '"$ref"' in path.read_text()
    ]
    assert len(schemas) >= 50
    read_in_root = []
    is_in_root = SchemaCompiler._is_in_root

    def counted(self: SchemaCompiler, reference: str, resolver: Any) -> bool:
        answer = is_in_root(self, reference, resolver)
        read_in_root.append(answer)
        return answer

    monkeypatch.setattr(SchemaCompiler, "_is_in_root", counted)
    fast = [compile_all(schema) for schema in schemas]
    assert sum(read_in_root) >= 500  # most references took the pointer path
    monkeypatch.setattr(SchemaCompiler, "_is_in_root", lambda *arguments: False)
    monkeypatch.setattr(resolving, "has_identifiers", lambda root: True)
    for schema, answer in zip(schemas, fast, strict=True):
        assert compile_all(schema) == answer


def test_an_all_of_target_keeps_its_own_base() -> None:
    # The allOf branch's target lives in sub/a.json: its "b.json" is sub/b.json (an integer),
    # not the root's b.json (a string), though the merge is compiled under the root's base.
    schema = {
        "$id": "https://example.com/root.json",
        "$defs": {
            "A": {
                "$id": "https://example.com/sub/a.json",
                "type": "object",
                "properties": {"b": {"$ref": "b.json"}, "c": {"$ref": "#/$defs/C"}},
                "required": ["b"],
                "$defs": {"C": {"type": "boolean"}},
            },
            "B": {"$id": "https://example.com/sub/b.json", "type": "integer"},
            "Wrong": {"$id": "https://example.com/b.json", "type": "string"},
        },
        "allOf": [{"$ref": "sub/a.json"}],
    }
    accepts = accepts_under(schema)
    assert accepts({"b": 1}) and accepts({"b": 1, "c": True})
    assert not accepts({"b": "x"}) and not accepts({"b": 1, "c": 1})


def test_absolute_references_leave_data_alone() -> None:
    schema = {"$id": "d/", "properties": {"x": {"$ref": "x.json", "const": {"$ref": "y"}}}}
    copy = resolving.absolute_references(schema, "https://example.com/d/")  # its own base
    assert copy["$id"] == "https://example.com/d/"
    assert copy["properties"]["x"] == {
        "$ref": "https://example.com/d/x.json",
        "const": {"$ref": "y"},
    }
    assert schema["properties"]["x"]["$ref"] == "x.json"


@pytest.mark.parametrize(
    ("identifier", "reference"),
    [("sub/a.json", "b.json"), ("https://example.com/sub/a.json", "#/$defs/B2")],
)
def test_an_all_of_target_with_a_relative_id_and_named_properties(
    identifier: str, reference: str
) -> None:
    # Its own "$id" was joined twice (sub/sub/b.json did not resolve), and a property named
    # "const" was copied as data, its relative $ref left to the parent's base.
    target = {
        "$id": identifier,
        "type": "object",
        "properties": {"p": {"$ref": reference}, "const": {"$ref": reference}},
        "$defs": {"B2": {"type": "integer"}},
    }
    schema = {
        "$id": "https://example.com/root.json",
        "$defs": {
            "a": target,
            "b": {"$id": "sub/b.json", "type": "integer"},
            "wrong": {"$id": "b.json", "type": "string"},
            "B2": {"type": "string"},
        },
        "allOf": [{"$ref": "sub/a.json"}],
    }
    accepts = accepts_under(schema)
    assert accepts({"p": 1, "const": 2})
    assert not accepts({"p": "s"}) and not accepts({"const": "s"})


def test_recursion_through_all_of_into_another_resource() -> None:
    # The target's absolute copy was made anew at each visit: never met again, unrolled.
    node = {
        "$id": "https://example.com/node.json",
        "type": "object",
        "properties": {
            "child": {"allOf": [{"$ref": "#"}], "description": "kid"},
            "v": {"type": "integer"},
        },
    }
    schema = {
        "$id": "https://example.com/root.json",
        "$defs": {"node": node},
        "allOf": [{"$ref": "node.json"}],
    }
    accepts = accepts_under(schema)
    assert accepts({"child": {"child": {"v": 1}}}) and not accepts({"child": {"v": "x"}})
