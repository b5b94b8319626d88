"""The flattened IR: the native flattening against the Python reference, the fingerprint
built on it, the errors of undefined references, and the nodes rebuilt from the arrays (a
compact grammar's)."""

import json
import pickle
import weakref
from enum import StrEnum
from pathlib import Path

import numpy as np
import pytest
from flatten_reference import flatten_reference
from hypothesis import given, settings
from hypothesis import strategies as st

from formline.grammar.ir import (
    ByteSet,
    Choice,
    Except,
    Grammar,
    GrammarError,
    Literal,
    Minimized,
    Node,
    Repeat,
    RuleReference,
    Sequence,
    expanded_size,
    flatten,
    unflatten,
)
from formline.parser.pushdown import build_pushdown
from formline.schema import SchemaError
from formline.schema.compiler import SchemaOptions, compile_to_grammar
from formline.schema.numbers import number_node

MASKBENCH = Path(__file__).resolve().parents[1] / "data" / "maskbench"
FIELDS = ("kind", "a", "b", "c", "children", "data", "range_pairs", "rule_root")


def assert_same_flat(rules: dict[str, Node]) -> None:
    native, reference = flatten(rules), flatten_reference(rules)
    for name in FIELDS:
        assert np.array_equal(getattr(native, name), getattr(reference, name)), name
    assert native.rule_names == reference.rule_names
    assert native.roots == reference.roots


def built_grammar(path: Path) -> Grammar:
    """A MaskBench schema's grammar as the schema compiler builds it (``schema_to_grammar``
    answers a compact one, whose nodes are rebuilt from the arrays, shared by value)."""
    grammar, _ = compile_to_grammar(json.loads(path.read_text())["schema"], SchemaOptions())
    return grammar


def trees() -> st.SearchStrategy[Node]:
    leaves = st.one_of(
        st.lists(st.tuples(st.integers(0, 250), st.integers(0, 5)), max_size=3).map(
            lambda pairs: ByteSet(tuple((low, low + width) for low, width in pairs))
        ),
        st.binary(max_size=4).map(Literal),
        st.sampled_from(["root", "other"]).map(RuleReference),
    )
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3).map(lambda items: Sequence(tuple(items))),
            st.lists(inner, min_size=1, max_size=3).map(lambda items: Choice(tuple(items))),
            st.tuples(inner, st.integers(0, 3), st.one_of(st.none(), st.integers(0, 3))).map(
                lambda case: Repeat(case[0], case[1], None if case[2] is None else sum(case[1:]))
            ),
            # Excluded strings of every length, the empty one included: the native key
            # stores each one's length before its bytes.
            st.tuples(inner, st.lists(st.binary(max_size=3), max_size=3)).map(
                lambda case: Except(case[0], tuple(case[1]))
            ),
            inner.map(Minimized),
        ),
        max_leaves=12,
    )


@given(trees(), trees())
@settings(max_examples=200, deadline=None)
def test_native_flattening_equals_the_reference(root, other) -> None:
    assert_same_flat({"root": root, "other": other})


def test_native_flattening_equals_the_reference_on_maskbench() -> None:
    compared = 0
    for path in sorted(MASKBENCH.glob("*.json"))[::15]:
        try:
            grammar = built_grammar(path)
        except SchemaError:
            continue  # declined schemas: their errors are tested in tests/schema
        assert_same_flat(grammar.rules)
        compared += 1
    assert compared >= 15


def test_native_flattening_equals_the_reference_past_its_indexes_first_size() -> None:
    # MaskBench's largest grammars: about 3,800 node objects and 1,600 distinct values, past
    # the 1,024 slots native/flat_index.hpp's indexes start with (they grow at half full).
    for name in ("JsonSchemaStore---meltano.schema", "Github_ultra---o41081"):
        grammar = built_grammar(MASKBENCH / f"{name}.json")
        assert len(grammar.flat().kind) > 1_024
        assert_same_flat(grammar.rules)


def test_shared_nodes_are_numbered_once() -> None:
    shared = Sequence((Literal(b"ab"), ByteSet(((48, 57),))))
    flat = flatten({"root": Sequence((shared, shared, Repeat(shared, 2, 3)))})
    assert len(flat.kind) == 5  # literal, byte set, shared sequence, repeat, root
    assert np.count_nonzero(flat.kind == 2) == 2


def test_equal_subtrees_built_apart_are_numbered_once() -> None:
    def digits() -> Node:
        return Sequence((ByteSet(((49, 57),)), Repeat(ByteSet(((48, 57),)), 0, None)))

    unsigned, again = digits(), digits()
    assert unsigned is not again
    flat = flatten({"root": Choice((unsigned, Sequence((Literal(b"-"), again))))})
    # two byte sets, the repeat, the digits, "-", the signed sequence, the root
    assert len(flat.kind) == 7
    # A number's signed branch now shares its digits with the unsigned one in the automaton:
    # 12 states made lazily (every one), 22 before the sharing (9 minimal).
    automaton = build_pushdown(Grammar({"root": number_node(None, None)}))
    automaton.tables()  # every state made
    assert automaton.size <= 12


def test_nodes_whose_fields_read_alike_as_bytes_stay_apart() -> None:
    # The native numbering keys a node by its fields as bytes: excluded strings split
    # differently, an empty one, and a literal of a byte set's bytes must not meet.
    item = Repeat(ByteSet(((97, 98),)), 0, None)
    options = (
        Except(item, (b"a", b"b")),
        Except(item, (b"ab",)),
        Except(item, (b"", b"a")),
        Except(item, (b"a",)),
        Except(Repeat(ByteSet(((97, 98),)), 0, None), (b"ab",)),  # equal to the second
        Literal(bytes((97, 98))),
        ByteSet(((97, 98),)),
    )
    rules = {"root": Choice(options)}
    assert_same_flat(rules)
    # item's byte set and repeat, four distinct Excepts, the literal, the root
    assert len(flatten(rules).kind) == 8


def test_an_undefined_reference_names_both_rules() -> None:
    body = Sequence((Literal(b"x"), RuleReference("missing")))
    with pytest.raises(GrammarError, match="rule 'item' references undefined rule 'missing'"):
        Grammar({"root": RuleReference("item"), "item": body})


def test_fingerprint_tells_grammars_apart_and_equal_ones_alike() -> None:
    def digit_run(maximum: int | None) -> Grammar:
        return Grammar({"root": Repeat(ByteSet(((48, 57),)), 1, maximum)})

    assert digit_run(3).fingerprint() == digit_run(3).fingerprint()
    fingerprints = {
        digit_run(3).fingerprint(),
        digit_run(4).fingerprint(),
        digit_run(None).fingerprint(),
        Grammar({"root": Repeat(ByteSet(((48, 58),)), 1, 3)}).fingerprint(),
        Grammar({"root": Literal(b"12")}).fingerprint(),
        Grammar({"root": Literal(b"13")}).fingerprint(),
        Grammar({"root": Literal(b"13"), "x": Literal(b"")}).fingerprint(),
        Grammar(
            {"root": Literal(b"13"), "x": Literal(b"")}, called_rules=frozenset("x")
        ).fingerprint(),
    }
    assert len(fingerprints) == 8


@given(trees(), trees())
@settings(max_examples=200, deadline=None)
def test_unflattening_gives_back_equal_rules_and_the_same_arrays(root, other) -> None:
    rules = {"root": root, "other": other}
    flat = flatten(rules)
    rebuilt = unflatten(flat)
    assert rebuilt == rules
    assert [expanded_size(rebuilt[name]) for name in rules] == [
        expanded_size(rules[name]) for name in rules
    ]
    again = flatten(rebuilt)
    for name in FIELDS:
        assert np.array_equal(getattr(again, name), getattr(flat, name)), name


def test_a_compact_grammar_equals_its_original_and_rebuilds_its_rules() -> None:
    for name in ("JsonSchemaStore---meltano.schema", "Github_ultra---o41081"):
        grammar = built_grammar(MASKBENCH / f"{name}.json")
        compact = grammar.compact()
        assert compact == grammar and hash(compact) == hash(grammar)  # the same arrays
        assert compact.start == grammar.start and compact.called_rules == grammar.called_rules
        for rule in grammar.rules:
            assert compact.rule_size(rule) == expanded_size(grammar.rules[rule])
        assert compact.rules == grammar.rules  # rebuilt from the arrays, equal node by node
        assert compact.rules is compact.rules  # rebuilt once, then kept by this object
        # Shared by value now: as many distinct node objects as flat nodes.
        distinct = {id(node) for body in compact.rules.values() for node in walk_all(body)}
        assert len(distinct) == len(grammar.flat().kind) < count_objects(grammar)


def walk_all(node: Node) -> list[Node]:
    found, pending, seen = [], [node], set()
    while pending:
        current = pending.pop()
        if id(current) not in seen:
            seen.add(id(current))
            found.append(current)
            pending.extend(current.children())
    return found


def count_objects(grammar: Grammar) -> int:
    return len({id(node) for body in grammar.rules.values() for node in walk_all(body)})


def test_grammars_are_immutable_compared_by_value_and_pickled() -> None:
    digits = Repeat(ByteSet(((48, 57),)), 1, None)
    grammar = Grammar({"root": Sequence((Literal(b"n="), digits))}, source="n=[0-9]+")
    with pytest.raises(AttributeError, match="immutable"):
        grammar.start = "other"  # type: ignore[misc]
    assert grammar != Grammar({"root": Sequence((Literal(b"n:"), digits))})
    assert grammar == Grammar({"root": Sequence((Literal(b"n="), digits))})  # source aside
    assert grammar != Grammar({"root": Literal(b"x"), "x": digits}, "x")
    restored = pickle.loads(pickle.dumps(grammar.compact()))
    assert restored == grammar and restored.source == "n=[0-9]+"
    assert restored.rules == grammar.rules
    assert weakref.ref(restored)() is restored


class RuleName(StrEnum):
    ROOT = "root"
    DIGIT = "digit"


def test_rule_names_of_a_str_subclass_survive_compaction_and_pickling() -> None:
    # Compiled, a node's typed str member would refuse a StrEnum that the source accepts.
    grammar = Grammar(
        {
            RuleName.ROOT: Sequence((Literal(b"n="), RuleReference(RuleName.DIGIT))),
            RuleName.DIGIT: Repeat(ByteSet(((48, 57),)), 1, None),
        },
        RuleName.ROOT,
        called_rules=frozenset({"digit"}),
    )
    compact = grammar.compact()
    assert compact.rules == grammar.rules
    assert pickle.loads(pickle.dumps(compact)) == grammar
    assert RuleReference(RuleName.DIGIT) == RuleReference("digit")
