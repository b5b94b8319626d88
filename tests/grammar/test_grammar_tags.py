"""Structural tags as grammar: text without the trigger, then tagged bodies."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from formline.grammar.ir import Grammar, GrammarError
from formline.grammar.tags import TAGGED_START, tagged_grammar, text_without
from formline.parser.pushdown import build_pushdown

TRIGGER = b"<tc>"


def language(trigger: bytes) -> object:
    return build_pushdown(Grammar({"root": text_without(trigger)}))


@pytest.mark.parametrize("trigger", [b"a", b"ab", TRIGGER, b"<tool_call>"])
def test_text_without_is_every_string_that_lacks_the_trigger(trigger: bytes) -> None:
    automaton = language(trigger)
    alphabet = sorted(set(trigger)) + [ord("x")]
    for length in range(7):
        for combination in itertools.product(alphabet, repeat=length):
            text = bytes(combination)
            assert automaton.matches(text) == (trigger not in text), text  # type: ignore[attr-defined]


@given(st.binary(max_size=40))
def test_text_without_agrees_with_a_substring_search_on_any_bytes(text: bytes) -> None:
    automaton = language(b"<tool_call>")
    salted = text.replace(b"<", b"<tool_ca")  # near-misses are frequent
    assert automaton.matches(salted) == (b"<tool_call>" not in salted)  # type: ignore[attr-defined]


def test_a_trigger_that_repeats_its_first_byte_or_is_empty_is_refused() -> None:
    with pytest.raises(GrammarError, match="repeat its first byte"):
        text_without(b"abab")
    with pytest.raises(GrammarError, match="must not be empty"):
        text_without(b"")


def body() -> Grammar:
    return Grammar.from_regex("[0-9]+")


def accepts(grammar: Grammar, text: bytes) -> bool:
    return build_pushdown(grammar).matches(text)


def test_text_then_optional_tags() -> None:
    grammar = tagged_grammar(body(), TRIGGER, b"<tc>", b"</tc>", text_first=True, max_tags=2)
    assert grammar.start == TAGGED_START
    assert accepts(grammar, b"just text, even <t and <tc")
    assert accepts(grammar, b"")
    assert accepts(grammar, b"let me see <tc>42</tc>")
    assert accepts(grammar, b"<tc>1</tc>\n<tc>2</tc>")
    assert not accepts(grammar, b"<tc>1</tc>\n<tc>2</tc>\n<tc>3</tc>")  # two tags at most
    assert not accepts(grammar, b"text <tc>nope</tc>")  # inside a tag, the body's grammar
    assert not accepts(grammar, b"<tc>1</tc> and more text")  # nothing after the tags
    assert not accepts(grammar, b"<tc>1")  # a tag must close


def test_without_text_first_the_answer_is_the_tags() -> None:
    grammar = tagged_grammar(body(), TRIGGER, b"<tc>\n", b"\n</tc>", text_first=False)
    assert accepts(grammar, b"<tc>\n7\n</tc>")
    assert not accepts(grammar, b"x<tc>\n7\n</tc>")
    assert not accepts(grammar, b"")


def test_bad_tags_are_named() -> None:
    with pytest.raises(GrammarError, match="must start with its trigger"):
        tagged_grammar(body(), TRIGGER, b"[", b"]", text_first=True)
    with pytest.raises(GrammarError, match="at least one tag"):
        tagged_grammar(body(), TRIGGER, TRIGGER, b"</tc>", text_first=True, max_tags=0)
