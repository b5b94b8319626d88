"""Automata: determinisation, minimisation, trimming and the state limits."""

import time

import numpy as np
import pytest

from formline.automata import AutomatonLimitError, build_nfa, determinize, minimize, trim
from formline.grammar.regex import parse_regex


def nfa_of(pattern: str, state_limit: int = 500_000):
    return build_nfa(parse_regex(pattern), lambda name: None, lambda name: False, state_limit)


def test_minimisation_merges_equivalent_states_and_keeps_the_language() -> None:
    raw = trim(determinize(nfa_of("(ab|cb)(ab|cb)")), set())
    assert raw is not None
    small = minimize(raw)
    assert small.size == 5  # start, after a|c, after one pair, after a|c again, accept
    for text in [b"abab", b"cbab", b"abcb", b"cbcb"]:
        assert small.matches(text)
    for text in [b"ab", b"abcbab", b"aab", b""]:
        assert not small.matches(text)


def test_minimal_dfa_of_counted_repetition_has_linear_size() -> None:
    dfa = minimize(trim(determinize(nfa_of("[0-9]{3,7}")), set()))
    assert dfa.size == 8


def test_trim_drops_dead_states_and_reports_empty_languages() -> None:
    dfa = determinize(nfa_of("a[^\\x00-\\U0010ffff]"))  # an empty class: nothing follows 'a'
    assert trim(dfa, set()) is None
    live = trim(determinize(nfa_of("ab|ac")), set())
    assert live is not None and bool(np.all(live.transitions < live.size))


def test_dfa_state_limit_is_an_error_in_bounded_time() -> None:
    started = time.perf_counter()
    with pytest.raises(AutomatonLimitError, match="more than 1000 DFA states"):
        determinize(nfa_of("(a|b)*a(a|b){12}"), state_limit=1000)
    assert time.perf_counter() - started < 10


def test_nfa_state_limit_is_an_error() -> None:
    with pytest.raises(AutomatonLimitError, match="more than 1000 NFA states"):
        nfa_of("(abc){500}", state_limit=1000)
