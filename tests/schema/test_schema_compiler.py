"""Unit tests of the schema compiler: the language each keyword gives, and the report."""

from __future__ import annotations

import gc
import itertools
import json
from typing import Annotated, Any, Literal

import jsonschema
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from formline.automata.nfa import AutomatonLimitError
from formline.constraint import Constraint
from formline.grammar import Grammar
from formline.grammar.ir import Node, expanded_size
from formline.mask.compiler import CompileCache
from formline.mask.reference import brute_force_allowed_ids
from formline.parser.pushdown import build_pushdown, build_pushdown_reference
from formline.schema import SchemaError, objects, schema_grammar, schema_to_grammar
from formline.schema.api import compile_schema, serialize_like_schema
from formline.schema.compiler import SchemaCompiler, SchemaOptions
from formline.schema.json_text import NOTHING, string_body_except
from formline.schema.nesting import MAX_INTEGER_BITS, check_nesting
from formline.schema.patterns import length_node
from formline.schema.report import KeywordUse, SchemaReport


def language(schema: Any, **options: Any) -> Any:
    grammar, report = schema_to_grammar(schema, **options)
    automaton = build_pushdown(grammar)

    def accepts(value: Any) -> bool:
        text = value if isinstance(value, bytes) else compact(value).encode()
        return automaton.matches(text)

    accepts.report = report  # type: ignore[attr-defined]
    return accepts


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def kinds(report: Any, kind: str) -> set[tuple[str, str]]:
    return {(use.keyword, use.pointer) for use in getattr(report, kind)}


def test_properties_keep_declared_order_and_optional_ones_may_be_skipped() -> None:
    accepts = language(
        {
            "type": "object",
            "properties": {"a": {"type": "string"}, "b": {"type": "integer"}, "c": {}},
            "required": ["b"],
            "additionalProperties": False,
        }
    )
    assert accepts({"b": 1})
    assert accepts({"a": "x", "b": 1, "c": [1, {"d": None}]})
    assert accepts({"b": 1, "c": True})
    assert not accepts({"b": 1, "a": "x"})  # out of declared order
    assert not accepts({"a": "x"})  # required b missing
    assert not accepts({"b": 1, "z": 0})  # additionalProperties false
    assert not accepts({"b": "1"})


def test_additional_properties_default_allows_other_keys_but_not_declared_names() -> None:
    accepts = language({"type": "object", "properties": {"a": {"type": "integer"}}})
    assert accepts({}) and accepts({"a": 1}) and accepts({"a": 1, "b": "x"}) and accepts({"ab": 1})
    assert not accepts(b'{"a":"x"}')
    assert not accepts(b'{"a":1,"a":2}')  # a declared name cannot come back as an extra key
    assert not accepts(b'{"b":1,"a":"x"}')


@pytest.mark.parametrize(
    "names",
    [
        ["base", "height", "length", "radius", "width"],
        ["a", "ab", "abc", ""],
        ["é", "naïve", "中文", 'a"q', "back\\slash", "tab\t", "~", " "],
    ],
)
def test_a_key_of_additional_properties_is_any_string_but_the_declared_names(
    names: list[str],
) -> None:
    grammar = Grammar({"root": string_body_except(names, length_node(0, None))})
    automaton = build_pushdown(grammar)

    def accepts(key: str) -> bool:
        return automaton.matches(compact(key).encode()[1:-1])

    assert not any(accepts(name) for name in names)
    others = ["", "x", "ba", "bas", "basee", "Base", "a b", "é!", "中", "😀", "\n", '"', "\x7f"]
    others += [name + "\u0001" for name in names] + [name[:-1] for name in names if name]
    for other in others:
        assert accepts(other) == (other not in names), other
    if all(name.isascii() and name.isalpha() for name in names):
        # The escapes and multi-byte characters after any trie node are one shared piece of
        # automaton (5 names made 346 states before minimisation, for 40).
        automaton.tables()  # every state made
        assert automaton.size <= 1.5 * build_pushdown_reference(grammar).size


def test_additional_properties_schema_and_pattern_properties() -> None:
    accepts = language(
        {
            "type": "object",
            "patternProperties": {"^x-": {"type": "integer"}},
            "additionalProperties": False,
        }
    )
    assert accepts({"x-a": 1}) and accepts({})
    assert not accepts({"x-a": "s"}) and not accepts({"y": 1})
    typed = language({"type": "object", "additionalProperties": {"type": "boolean"}})
    assert typed({"q": True, "r": False}) and not typed({"q": 1})


def test_many_optional_properties_compile_linearly_and_count_bounds_hold() -> None:
    properties = {f"p{index}": {"type": "integer"} for index in range(40)}
    schema = {"type": "object", "properties": properties, "additionalProperties": False}
    accepts = language({**schema, "minProperties": 2, "maxProperties": 3})
    assert accepts({"p0": 1, "p39": 2}) and accepts({"p1": 1, "p2": 2, "p3": 3})
    assert not accepts({"p5": 1}) and not accepts({"p1": 1, "p2": 2, "p3": 3, "p4": 4})
    assert not accepts({})
    unbounded = language(schema)
    assert unbounded({}) and unbounded({"p39": 0}) and not unbounded({"p39": 0, "p0": 1})


@pytest.mark.parametrize("bounds", [(0, None), (1, None), (2, None), (0, 1), (1, 2), (3, 3)])
def test_member_counts_accept_exactly_the_subsets_the_validator_accepts(
    bounds: tuple[int, int | None],
) -> None:
    # Every required/optional pattern of three properties, every subset written in declared
    # order: the member automaton (states "at property i, c written") against jsonschema.
    minimum, maximum = bounds
    names = ("a", "b", "c")
    counts = {"minProperties": minimum} | ({} if maximum is None else {"maxProperties": maximum})
    for required in itertools.product((False, True), repeat=3):
        schema = {
            "type": "object",
            "properties": {name: {"type": "integer"} for name in names},
            "required": [
                name for name, is_needed in zip(names, required, strict=True) if is_needed
            ],
            "additionalProperties": False,
            **counts,
        }
        instances = [
            {name: 1 for name, is_in in zip(names, chosen, strict=True) if is_in}
            for chosen in itertools.product((False, True), repeat=3)
        ]
        valid = [jsonschema.Draft202012Validator(schema).is_valid(one) for one in instances]
        if not any(valid):  # more required than maxProperties: no value at all
            with pytest.raises(SchemaError, match="accepts no value"):
                language(schema)
            continue
        accepts = language(schema)
        assert [accepts(one) for one in instances] == valid, schema


def test_member_states_are_counted_by_the_places_that_reach_them() -> None:
    # The counts decide which states become called rules past the inline budget (a state
    # reached from two places), so they are pinned, not only the language: optional a,
    # required b, optional c, states (index, written) at index * 2 + written.
    compiler = SchemaCompiler({"type": "object"}, SchemaOptions())
    schema = {"properties": {"a": {}, "b": {}, "c": {}}, "required": ["b"]}
    members = objects._Members(compiler, schema, "", compiler.resolver, 0)
    members._declare()
    members.counted = 2
    nexts = members._nexts()
    assert nexts == [1, 1]
    counts = members._reachable(nexts)
    # (0,0) once; a: (1,0) and (1,1) once each; b from both: (2,1) twice; c: (3,1) once
    assert counts == [1, 0, 1, 1, 0, 2, 0, 1]
    # Inlined, a state is its member and what follows from each way on: (3,1) is the empty
    # extra (1 node), (2,1) = m + 1, (1,0) = (1,1) = m + (2,1), (0,0) = m + (1,0) + (1,1).
    size = expanded_size(members.declared[0][1])
    assert members._inline_size(counts, nexts, NOTHING) == 5 * size + 2


def nesting_of(value: Any) -> tuple[int, bool]:
    """The deepest level of ``value`` (itself at 0) and whether an integer there is too long
    to print: what check_nesting tests, by recursion."""
    children = list(value.values()) if isinstance(value, dict) else value
    if not isinstance(value, dict | list):
        return 0, isinstance(value, int) and value.bit_length() > MAX_INTEGER_BITS
    found = [nesting_of(child) for child in children]
    return 1 + max((depth for depth, _ in found), default=-1), any(big for _, big in found)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.sampled_from([10**4100, -(10**4100)])
    | st.text(max_size=2),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=2), children, max_size=3)
    ),
    max_leaves=12,
)


@given(json_values, st.integers(0, 5))
def test_the_nesting_check_agrees_with_a_recursive_walk(value: Any, limit: int) -> None:
    deepest, has_huge_integer = nesting_of(value)
    if deepest <= limit and not has_huge_integer:
        check_nesting(value, limit)
    else:
        with pytest.raises(SchemaError, match=r"nested deeper|digits"):
            check_nesting(value, limit)


def test_many_optional_properties_leave_few_stacks_after_a_value(
    smollm2_vocab: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Github_hard o30769's shape: 118 optional integers, other keys allowed after them.
    properties = {f"field{index}": {"type": "integer"} for index in range(118)}
    schema = {"type": "object", "properties": properties}
    accepts = language(schema)
    assert accepts({"field3": 1, "field117": 2, "other": 3}) and accepts({"field117": 0})
    assert not accepts({"field3": 1, "field2": 2}) and not accepts(b'{"field3":1,"field3":2}')

    def stacks_after_a_value() -> tuple[int, Any]:
        compiled = compile_schema(schema, smollm2_vocab, disk_cache=False, cache=CompileCache())
        matcher = compiled.matcher()
        assert matcher.accept_string('{"field3":12')
        return len(matcher.state_key()[0]), matcher

    count, matcher = stacks_after_a_value()
    assert count <= 118 // objects.MEMBER_CHUNK + 2
    np.testing.assert_array_equal(matcher.allowed_token_ids(), brute_force_allowed_ids(matcher))
    assert matcher.accept_string(',"field117":5}')
    monkeypatch.setattr(objects, "MEMBER_CHUNK", 1)  # every shared state a rule: as before
    assert stacks_after_a_value()[0] >= 100


def test_equal_big_string_values_share_one_called_rule(smollm2_vocab: Any) -> None:
    # Github_ultra o41081's shape: a uri at many properties was one inlined copy each.
    schema = {
        "type": "object",
        "properties": {
            "home": {"type": "string", "format": "uri"},
            "docs": {"type": "string", "format": "uri"},
            "mail": {"type": "string", "format": "email"},
            "site": {"type": "string", "format": "uri"},
            "backup": {"type": "string", "format": "email"},
            "note": {"type": "string", "maxLength": 8},
            "tag": {"type": "string", "maxLength": 2},
        },
        "additionalProperties": False,
    }
    grammar, _ = schema_to_grammar(schema)
    strings = [grammar.rules[name] for name in grammar.called_rules if name.startswith("string")]
    # The uri and the email, met again; not the note (met once) nor the tag (small).
    assert len(strings) == 2, grammar.called_rules
    assert {expanded_size(rule) for rule in strings} == {715, 856}
    accepts = language(schema)
    assert accepts({"home": "https://a.org/x", "mail": "a@b.org", "site": "ftp://c.net"})
    assert accepts({"backup": "c@d.org", "note": "12345678"}) and not accepts({"note": "123456789"})
    assert not accepts({"home": "not a uri"}) and not accepts({"site": "a b"})
    assert not accepts({"mail": "https://a.org"}) and not accepts({"tag": "abc"})
    compiled = compile_schema(schema, smollm2_vocab, disk_cache=False, cache=CompileCache())
    for text in ('{"home":"https://a.org","docs":"htt', '{"site":"https://a.org/x'):
        matcher = compiled.matcher()
        assert matcher.accept_string(text)
        np.testing.assert_array_equal(matcher.allowed_token_ids(), brute_force_allowed_ids(matcher))


def test_many_large_optional_members_stay_under_the_nfa_estimate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 80 optional members of about 1,800 IR nodes each (under SHARED_MEMBER_NODES, so inlined).
    values = [f"value-{index:03d}-abcdefghij" for index in range(90)]
    schema = {"type": "object", "properties": {f"field{i}": {"enum": values} for i in range(80)}}
    accepts = language(schema)
    assert accepts({"field3": values[1], "field79": values[89]})
    assert not accepts({"field79": values[0], "field3": values[1]})
    # Chunks of 8 whatever the members' size: one rule's estimate was 573,372 NFA states.
    monkeypatch.setattr(objects, "MEMBER_CHUNK_NODES", 10**9)
    with pytest.raises(AutomatonLimitError, match="NFA states"):
        build_pushdown(schema_to_grammar(schema, cache=CompileCache())[0])


def test_arrays_items_prefix_items_and_counts() -> None:
    accepts = language(
        {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3}
    )
    assert accepts([1]) and accepts([1, 2, 3])
    assert not accepts([]) and not accepts([1, 2, 3, 4]) and not accepts(["a"])
    tuple_like = language(
        {"type": "array", "prefixItems": [{"type": "string"}, {"type": "boolean"}], "items": False}
    )
    assert tuple_like([]) and tuple_like(["a"]) and tuple_like(["a", True])
    assert not tuple_like([1]) and not tuple_like(["a", True, 1])
    draft7 = language(
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "items": [{"type": "integer"}],
            "additionalItems": {"type": "string"},
        }
    )
    assert draft7([1, "a", "b"]) and not draft7([1, 2])


def test_numbers_and_integers_with_exact_bounds() -> None:
    integer = language({"type": "integer", "minimum": 3, "exclusiveMaximum": 120})
    assert integer(3) and integer(119) and integer(5.0)
    assert not integer(2) and not integer(120) and not integer(3.5)
    number = language({"type": "number", "minimum": 0.5, "maximum": 99.95})
    assert number(0.5) and number(99.95) and number(1) and number(1e-1 * 6)
    assert not number(0.49) and not number(99.951) and not number(-1)


def test_strings_lengths_in_characters_and_escapes() -> None:
    accepts = language({"type": "string", "minLength": 2, "maxLength": 3})
    assert accepts("ab") and accepts("été") and accepts('a"\\') and accepts("a\n")
    assert not accepts("a") and not accepts("abcd")
    assert not accepts(b'"a\nb"')  # a raw control character is never valid JSON
    assert not accepts(b'"ab\\q"')  # an invalid escape


def test_enum_and_const_filtered_by_sibling_keywords() -> None:
    accepts = language({"enum": ["a", 1, None, {"x": [1]}], "type": ["string", "integer"]})
    assert accepts("a") and accepts(1) and accepts(1.0)
    assert not accepts(None) and not accepts({"x": [1]}) and not accepts("b")
    assert language({"const": "k"})("k")


def test_any_of_one_of_all_of_and_nullable() -> None:
    optional = language({"anyOf": [{"type": "string"}, {"type": "null"}]})
    assert optional("x") and optional(None) and not optional(1)
    merged = language(
        {
            "allOf": [
                {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"properties": {"b": {"type": "string"}}, "required": ["b"]},
            ]
        }
    )
    assert merged({"a": 1, "b": "x"}) and not merged({"a": 1}) and not merged({"b": "x"})
    nullable = language({"type": "string", "nullable": True})
    assert nullable(None) and nullable("s")


def test_one_of_reports_overlap_unless_branches_are_disjoint() -> None:
    disjoint = language({"oneOf": [{"type": "string"}, {"type": "integer"}]})
    assert ("oneOf", "") not in kinds(disjoint.report, "checked_after")
    overlapping = language({"oneOf": [{"type": "number"}, {"type": "integer"}]})
    assert ("oneOf", "") in kinds(overlapping.report, "checked_after")


def test_recursive_refs_become_recursive_rules() -> None:
    schema = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"v": {"type": "integer"}, "next": {"$ref": "#/$defs/node"}},
                "required": ["v"],
                "additionalProperties": False,
            }
        },
        "$ref": "#/$defs/node",
    }
    accepts = language(schema)
    assert accepts({"v": 1, "next": {"v": 2, "next": {"v": 3}}})
    assert not accepts({"v": 1, "next": {}})


def test_report_lists_every_keyword_once_in_the_right_list() -> None:
    accepts = language(
        {
            "type": "array",
            "items": {"type": "string", "pattern": "^a", "maxLength": 3},
            "uniqueItems": True,
            "x-vendor": 1,
            "title": "an annotation",
        }
    )
    report = accepts.report
    assert ("uniqueItems", "") in kinds(report, "checked_after")
    assert ("pattern", "/items") in kinds(report, "enforced")
    assert ("maxLength", "/items") in kinds(report, "checked_after")
    assert ("x-vendor", "") in kinds(report, "ignored")
    assert "title" not in {use.keyword for use in report.ignored}
    assert "compact" in report.to_text()


def test_whitespace_is_bounded() -> None:
    accepts = language({"type": "object", "properties": {"a": {"type": "integer"}}}, whitespace=2)
    assert accepts(b'{ "a" : 1 }') and accepts(b'{\n "a":1}')
    assert not accepts(b'{   "a":1}')


@pytest.mark.parametrize(
    ("schema", "keyword", "pointer"),
    [
        ({"properties": {"a": {"$ref": "#/$defs/missing"}}}, "$ref", "/properties/a"),
        ({"properties": {"a": {"type": "strin"}}}, "type", "/properties/a"),
        ({"properties": {"a": {"type": "string", "pattern": "(?=x)"}}}, "pattern", "/properties/a"),
        ({"minLength": -1}, "minLength", ""),
        ({"$dynamicRef": "#x"}, "$dynamicRef", ""),
    ],
)
def test_bad_schemas_raise_schema_error_with_keyword_and_pointer(
    schema: Any, keyword: str, pointer: str
) -> None:
    with pytest.raises(SchemaError) as caught:
        schema_to_grammar(schema)
    assert caught.value.pointer == pointer
    assert caught.value.keyword == keyword


def test_unsupported_keywords_can_be_handed_to_the_after_check() -> None:
    schema = {"type": "string", "pattern": "(?=x)x"}
    with pytest.raises(SchemaError):
        schema_to_grammar(schema)
    _, report = schema_to_grammar(schema, on_unsupported="check_after")
    assert ("pattern", "") in kinds(report, "checked_after")


class Address(BaseModel):
    street: str
    zip_code: Annotated[str, Field(pattern=r"^\d{5}$")]


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: Annotated[int, Field(ge=1, le=9)]


class Dog(BaseModel):
    kind: Literal["dog"]
    good: bool = True


class Person(BaseModel):
    name: Annotated[str, Field(min_length=1, max_length=20)]
    age: int | None = None
    address: Address
    pet: Cat | Dog = Field(discriminator="kind")


def test_pydantic_models_with_literal_annotated_optional_and_discriminated_unions() -> None:
    accepts = language(Person)
    person = {
        "name": "Ana",
        "age": None,
        "address": {"street": "Rua A", "zip_code": "12345"},
        "pet": {"kind": "cat", "lives": 9},
    }
    assert accepts(person)
    assert accepts({**person, "pet": {"kind": "dog"}, "age": 30})
    assert not accepts({**person, "pet": {"kind": "cat", "lives": 10}})
    assert not accepts({**person, "address": {"street": "x", "zip_code": "1234"}})
    assert not accepts({**person, "name": ""})
    assert ("oneOf", "/properties/pet") not in kinds(accepts.report, "checked_after")


def test_enormous_enum_and_deep_nesting_fail_cleanly_and_a_blowing_pattern_decodes() -> None:
    from formline.mask import GrammarMatcher, compile_grammar
    from formline.vocab import Vocabulary

    with pytest.raises(SchemaError) as caught:
        schema_to_grammar({"enum": ["x" * 1000 + str(index) for index in range(2000)]})
    assert caught.value.keyword == "enum"
    deep: dict[str, Any] = {"type": "integer"}
    for _ in range(200):
        deep = {"type": "array", "items": deep}
    with pytest.raises(SchemaError, match="deeper"):
        schema_to_grammar(deep)
    grammar, _ = schema_to_grammar({"type": "string", "pattern": "^(a|b)*a(a|b){24}$"})
    vocabulary = Vocabulary.from_list([b"a", b"b", b'"', b"<eos>"], eos_ids=[3])
    # Its DFA has 2^25 states: the automaton makes the ones decoding reaches (it refused the
    # pattern while it was built whole), a state per byte of this vocabulary at most.
    compiled = compile_grammar(grammar, vocabulary, disk_cache=False)
    matcher = GrammarMatcher(compiled)
    text = "ab" * 30 + "a" + "b" * 24
    assert matcher.accept_string('"' + text + '"') and matcher.can_end()
    assert not GrammarMatcher(compiled).accept_string('"' + "a" * 24 + '"')
    assert compiled.automaton.size < 2 * len(text) + 10


def test_compile_schema_gives_matcher_report_after_check_and_schema_order(
    smollm2_vocab: Any, smollm2_tokenizer: Any
) -> None:
    from formline.schema import compile_schema

    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        },
        "required": ["name"],
        "additionalProperties": False,
    }
    compiled = compile_schema(schema, smollm2_vocab, disk_cache=False)
    value = {"tags": ["a", "a"], "name": "Zoë"}
    text = compiled.serialize(value)
    assert text == '{"name":"Zoë","tags":["a","a"]}'
    matcher = compiled.matcher()
    for token_id in smollm2_tokenizer.encode(text, add_special_tokens=False):
        assert matcher.accept_token(token_id)
    assert matcher.can_end()
    assert compiled.check(value) and "non-unique" in compiled.check(value)[0]
    assert compiled.check({"name": "Zoë", "tags": ["a"]}) == []
    refused = compiled.matcher()
    assert not refused.accept_string(b'{"tags"')


def test_a_cache_hit_unpacks_its_report_when_first_read(smollm2_vocab: Any) -> None:
    cache = CompileCache(disk_cache=False)
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        },
    }
    first = compile_schema(schema, smollm2_vocab, cache=cache)
    hit = compile_schema(schema, smollm2_vocab, cache=cache)
    # A server's request never reads it: meltano.schema's unpacking was 91 µs of a 249 µs hit.
    assert not isinstance(hit._report, SchemaReport)
    report = hit.report
    assert report == first.report and report is not first.report
    assert hit.report is report  # unpacked once
    assert ("uniqueItems", "/properties/tags") in kinds(report, "checked_after")
    assert ("maxLength", "/properties/name") in kinds(report, "enforced")


def test_the_grammar_alone_leaves_a_cache_hit_report_packed(monkeypatch: Any) -> None:
    unpacked: list[Any] = []
    unpack = SchemaReport.unpack
    monkeypatch.setattr(
        SchemaReport, "unpack", staticmethod(lambda packed: unpacked.append(1) or unpack(packed))
    )
    cache = CompileCache(disk_cache=False)
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 9}}}
    built, _ = schema_to_grammar(schema, cache=cache)
    # A tool-calling request and vLLM's validate_params read only the grammar: unpacking
    # meltano.schema's report was 140 of the 345 µs of Constraint.grammar()'s hit.
    assert schema_grammar(schema, cache=cache).fingerprint() == built.fingerprint()
    constraint = Constraint.of({**schema, "title": "a schema no other test compiles"})
    assert constraint.grammar() is not None and constraint.grammar() is not None
    assert unpacked == []
    grammar, report = schema_to_grammar(schema, cache=cache)  # the report: unpacked
    assert unpacked == [1] and ("maxLength", "/properties/city") in kinds(report, "enforced")
    assert grammar.fingerprint() == built.fingerprint()


def test_values_under_pattern_properties_are_written_in_their_schema_order() -> None:
    service = {
        "type": "object",
        "properties": {"build": {"type": "string"}, "image": {"type": "string"}},
        "additionalProperties": False,
    }
    schema = {
        "type": "object",
        "properties": {
            "services": {"type": "object", "patternProperties": {"^[a-z]+$": service}},
            "version": {"type": "string"},
        },
    }
    value = {"version": "3", "services": {"web": {"image": "nginx", "build": "."}}}
    text = serialize_like_schema(schema, value)
    assert text == '{"services":{"web":{"build":".","image":"nginx"}},"version":"3"}'
    assert language(schema)(text.encode())


def test_a_flat_object_of_600_properties_compiles() -> None:
    properties = {f"p{index}": {"type": "integer"} for index in range(600)}
    accepts = language(
        {
            "type": "object",
            "properties": properties,
            "required": ["p599"],
            "additionalProperties": False,
        }
    )
    assert accepts({"p0": 1, "p599": 2}) and not accepts({"p0": 1})


def test_the_grammar_cache_keeps_property_order_apart() -> None:
    first = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
    second = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}}}
    for schema in (first, second):
        schema.update(required=["a", "b"], additionalProperties=False)
    assert language(first)({"a": 1, "b": 2}) and not language(first)(b'{"b":2,"a":1}')
    assert language(second)(b'{"b":2,"a":1}') and not language(second)({"a": 1, "b": 2})


def test_the_grammar_cache_keeps_no_node_objects_and_answers_reports_of_their_own() -> None:
    cache = CompileCache(disk_cache=False)
    schemas = [
        {
            "type": "object",
            "properties": {f"field{index}": {"type": "string", "maxLength": 8 + index}},
            "required": [f"field{index}"],
        }
        for index in range(13)
    ]
    schema_to_grammar(schemas.pop(), cache=cache)  # the modules' own memos (UTF-8 ranges)
    gc.collect()
    before = count_live_nodes()
    first = [schema_to_grammar(schema, cache=cache) for schema in schemas]
    assert count_live_nodes() > before  # the grammars as built, nodes and all
    del first
    gc.collect()
    assert count_live_nodes() == before  # what the cache keeps has none
    grammar, report = schema_to_grammar(schemas[3], cache=cache)
    assert count_live_nodes() == before  # a later caller's grammar rebuilds them when asked
    assert grammar.rules["root"] is not None and count_live_nodes() > before
    again, report_again = schema_to_grammar(schemas[3], cache=cache)
    assert grammar == again and grammar is not again
    assert report == report_again and report is not report_again
    assert ("maxLength", "/properties/field3") in kinds(report, "enforced")
    report.enforced.clear()  # a caller's report is its own: the cache's stays whole
    assert ("maxLength", "/properties/field3") in kinds(report_again, "enforced")
    third, _ = schema_to_grammar(schemas[3], cache=cache)
    assert third == grammar
    del grammar, again, third
    gc.collect()
    assert count_live_nodes() == before  # the nodes read went with their callers' grammars
    assert ("maxLength", "/properties/field3") in kinds(
        schema_to_grammar(schemas[3])[1], "enforced"
    )


def count_live_nodes() -> int:
    # type(), not isinstance: isinstance reads __class__, and some objects (torch's) warn.
    return sum(issubclass(type(item), Node) for item in gc.get_objects())


def test_an_unpacked_report_equals_the_packed_one_and_knows_its_uses() -> None:
    _, report = schema_to_grammar(
        {"type": "object", "properties": {"a": {"type": "string", "format": "uri"}}, "title": "t"}
    )
    packed = report.pack()
    unpacked = SchemaReport.unpack(packed)
    assert unpacked == report and unpacked.to_text() == report.to_text()
    assert all(type(use) is KeywordUse for use in unpacked.enforced + unpacked.ignored)
    first = unpacked.enforced[0]
    unpacked.add("enforced", *first)  # recorded already: not repeated
    assert unpacked.enforced.count(first) == 1
    unpacked.withdraw(first.keyword, first.pointer)
    assert first not in unpacked.enforced
    unpacked.add("enforced", *first)  # withdrawn, so new again
    assert unpacked.enforced.count(first) == 1 and SchemaReport.unpack(packed) == report


@pytest.mark.parametrize(
    ("child", "valid", "invalid"),
    [
        # FastAPI / Pydantic v1's form of a described child: allOf of one $ref.
        (
            {"allOf": [{"$ref": "#/$defs/node"}], "description": "the child"},
            [{"next": {"next": {"v": 3}}}, {"v": 1}],
            [{"next": {"next": {"v": "x"}}}, {"next": {"w": 1}}],
        ),
        # A $ref with a sibling inside its own target: its allOf form met again.
        (
            {"$ref": "#/$defs/node", "maxProperties": 1},
            [{"next": {"next": {}}}, {"next": {"v": 2}, "v": 1}],
            [{"next": {"next": {}, "v": 1}}],
        ),
        # Two branches, one a recursive $ref.
        (
            {"allOf": [{"$ref": "#/$defs/node"}, {"required": ["v"]}]},
            [{"next": {"next": {"v": 2}, "v": 1}}, {}],
            [{"next": {}}, {"next": {"next": {}, "v": 1}}],
        ),
    ],
)
def test_recursion_through_an_all_of_merge_is_a_rule(
    child: Any, valid: list[Any], invalid: list[Any]
) -> None:
    # Each was unrolled until "schema nested deeper than 64": a valid schema refused.
    node = {
        "type": "object",
        "properties": {"next": child, "v": {"type": "integer"}},
        "additionalProperties": False,
    }
    schema = {"$defs": {"node": node}, "$ref": "#/$defs/node"}
    accepts = language(schema)
    for value in valid:
        assert accepts(value), value
        assert next(jsonschema.Draft202012Validator(schema).iter_errors(value), None) is None
    for value in invalid:
        assert not accepts(value), value
        assert next(jsonschema.Draft202012Validator(schema).iter_errors(value), None) is not None


def test_recursion_through_merges_the_merge_makes() -> None:
    # A subclass overriding a recursive field: merging Base with the override makes a new
    # {"allOf": [Base's items, Derived's items]} at each visit; known by its values, it
    # is met again.
    schema = {
        "$defs": {
            "Base": {
                "type": "object",
                "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/Base"}}},
            },
            "Derived": {
                "allOf": [
                    {"$ref": "#/$defs/Base"},
                    {
                        "properties": {
                            "kids": {"items": {"$ref": "#/$defs/Derived"}},
                            "n": {"type": "integer"},
                        }
                    },
                ]
            },
        },
        "$ref": "#/$defs/Derived",
    }
    accepts = language(schema)
    assert accepts({"kids": [{"kids": []}], "n": 1})
    assert not accepts({"kids": [{"n": "x"}]})
