"""The Except node: the strings of its item but the excluded ones, exactly, in the native
build and in the Python builder (the native one reads the item's DFA in step with the
names' trie, the Python one determinises the item on the way)."""

import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from formline.grammar.ir import Except, Grammar, GrammarError, Literal, RuleReference
from formline.grammar.regex import parse_regex
from formline.parser.pushdown import build_pushdown, build_pushdown_reference
from formline.schema.json_text import string_body_except
from formline.schema.patterns import length_node

ITEMS = ["[ab]*", "a*b?", "(ab|ba)+", "[a-c]{0,3}", "a|b|ab|", "(a[bc])*c?"]
WORDS = st.text("abc", max_size=4)


@given(st.sampled_from(ITEMS), st.lists(WORDS, max_size=5), st.lists(WORDS, max_size=12))
@example("a|b|ab|", ["", "a", "b", "ab"], [])  # every string excluded: both builds refuse
@settings(max_examples=200, deadline=None)
def test_except_accepts_the_item_but_the_excluded_strings(
    pattern: str, names: list[str], probes: list[str]
) -> None:
    excluded = tuple(name.encode() for name in names)
    grammar = Grammar({"root": Except(parse_regex(pattern), excluded)})
    try:
        reference = build_pushdown_reference(grammar)
    except GrammarError as error:
        assert "matches no string" in str(error)
        with pytest.raises(GrammarError, match="matches no string"):
            build_pushdown(grammar)
        return
    native = build_pushdown(grammar)
    for probe in [*probes, *names, ""]:
        expected = re.fullmatch(pattern, probe) is not None and probe not in names
        assert native.matches(probe.encode()) == expected, (pattern, names, probe)
        assert reference.matches(probe.encode()) == expected, (pattern, names, probe)


def test_except_of_json_keys_is_one_state_per_trie_node() -> None:
    # 40 names of 10-12 bytes: the product has one NFA state per trie node, and its DFA is
    # about that size too (the IR trie before had two nodes per trie node and shared tail).
    names = [f"property_{index:02d}" for index in range(40)]
    grammar = Grammar({"root": string_body_except(names, length_node(0, None))})
    automaton = build_pushdown(grammar)
    trie_nodes = len({name[:end] for name in names for end in range(len(name) + 1)})
    assert automaton.size <= trie_nodes + 20
    assert not automaton.matches(b"property_07")
    assert automaton.matches(b"property_7") and automaton.matches(b"property_070")
    assert automaton.matches("property_0é".encode()) and automaton.matches(b"")


def test_except_with_a_called_item_is_refused_alike() -> None:
    grammar = Grammar(
        {"root": Except(RuleReference("inner"), (b"a",)), "inner": Literal(b"ab")},
        called_rules=frozenset({"inner"}),
    )
    messages = []
    for build in (build_pushdown, build_pushdown_reference):
        try:
            build(grammar)
        except GrammarError as error:
            messages.append(str(error))
    assert messages == ["the item of an Except node calls a rule"] * 2
