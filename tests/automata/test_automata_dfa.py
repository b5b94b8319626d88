"""Automata: determinisation, minimisation, trimming and the state limits."""

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from formline.automata import AutomatonLimitError, build_nfa, determinize, minimize, trim
from formline.automata.dfa import (
    determinize_reference,
    refine_partition,
    refine_partition_reference,
)
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
    with pytest.raises(AutomatonLimitError, match="more than the limit of 1,000"):
        nfa_of("(abc){500}", state_limit=1000)


NATIVE_PATTERNS = [
    r"(ab|cb)(ab|cb)",
    r"[0-9]{3,7}",
    r"(a|b)*a(a|b){4}",
    r"[a-zé中]+@[a-z]+\.(com|org)",
    r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?",
    r'"([^"\\]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"',
    r"x?y?z?(xy|yz)*",
]


@pytest.mark.parametrize("pattern", NATIVE_PATTERNS)
def test_native_subset_construction_and_refinement_equal_the_reference(pattern) -> None:
    nfa = nfa_of(pattern)
    native = minimize(trim(determinize(nfa), set()))
    reference_dfa = trim(determinize_reference(nfa), set())
    assert reference_dfa is not None
    # The reference's own minimisation, with the numpy refinement, gives the same size.
    labels = refine_partition_reference(
        reference_dfa.transitions, reference_dfa.accepting.astype(np.int64)
    )
    assert native.size == len(set(labels.tolist()))
    rng = np.random.default_rng(len(pattern))
    alphabet = sorted(set(pattern.encode()) | set(b'0123456789abxyz.@"\\'))
    for length in range(0, 9):
        for _ in range(40):
            text = bytes(int(rng.choice(alphabet)) for _ in range(length))
            assert native.matches(text) == reference_dfa.matches(text), text


def test_native_subset_construction_keeps_the_state_limit() -> None:
    with pytest.raises(AutomatonLimitError, match="more than 500 DFA states"):
        determinize(nfa_of("(a|b)*a(a|b){12}"), state_limit=500)


@given(
    st.integers(1, 40).flatmap(
        lambda states: st.tuples(
            st.lists(
                st.lists(st.integers(-1, states - 1), min_size=4, max_size=4),
                min_size=states,
                max_size=states,
            ),
            st.lists(st.integers(0, 2), min_size=states, max_size=states),
            st.sampled_from([None, 1, 2, 5]),
        )
    )
)
@settings(max_examples=200, deadline=None)
def test_native_refinement_equals_the_numpy_reference(case) -> None:
    rows, labels, rounds = case
    targets = np.array(rows, dtype=np.int32)[:, [0, 1, 2, 3, 1, 0]]  # repeated columns too
    native = refine_partition(targets, np.array(labels), rounds)
    reference = refine_partition_reference(targets, np.array(labels), rounds)
    pairs = set(zip(native.tolist(), reference.tolist(), strict=True))
    assert len(pairs) == len(set(native.tolist())) == len(set(reference.tolist()))
