"""Property tests: strings of the language are accepted; accepted token walks are in it.

Regexes are generated at random and checked against Python's ``re`` (full match) and the
``regex`` module's partial matching (an oracle independent of formline's automata: a token is
allowed iff the text so far plus the token can still be extended to a match).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import regex as regex_module
from helpers_mask import greedy_tokenize, sample_string, synthetic_vocabulary
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from formline.grammar import Grammar
from formline.mask import GrammarMatcher, compile_grammar
from formline.mask.bitmask import bitmask_to_ids, ids_to_bitmask
from formline.mask.reference import brute_force_allowed_ids

VOCABULARY = synthetic_vocabulary()
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

ATOMS = st.sampled_from(
    ["a", "b", "é", "中", '"', r"\{", "1", "[ab]", "[^a]", "[0-9]", "[a-c0-2]", "."]
)


def regex_strategy() -> st.SearchStrategy[str]:
    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.tuples(inner, inner).map("".join),
            st.tuples(inner, inner).map(lambda pair: f"(?:{pair[0]}|{pair[1]})"),
            st.tuples(inner, st.sampled_from(["?", "*", "+", "{1,3}", "{2}"])).map(
                lambda pair: f"(?:{pair[0]}){pair[1]}"
            ),
        )

    return st.recursive(ATOMS, extend, max_leaves=6)


def compiled_matcher(pattern: str) -> GrammarMatcher:
    return GrammarMatcher(
        compile_grammar(Grammar.from_regex(pattern), VOCABULARY, disk_cache=False)
    )


@SETTINGS
@given(data=st.data(), pattern=regex_strategy())
def test_strings_of_a_regex_are_accepted_along_their_tokenization(data, pattern: str) -> None:
    text = data.draw(st.from_regex(pattern, fullmatch=True))
    assume("\n" not in text or "." not in pattern)
    try:
        encoded = text.encode("utf-8")
    except UnicodeEncodeError:
        assume(False)
    assert re.fullmatch(pattern, text, re.ASCII)
    matcher = compiled_matcher(pattern)
    for token_id in greedy_tokenize(VOCABULARY, encoded):
        assert matcher.accept_token(token_id), (pattern, text)
    assert matcher.can_end() and matcher.accept_token(0)


def partial_oracle(pattern: str, prefix: bytes, token: bytes) -> bool | None:
    try:
        text = (prefix + token).decode("utf-8")
    except UnicodeDecodeError:
        return None  # the oracle works on str; token splits a character
    return regex_module.fullmatch(pattern, text, regex_module.ASCII, partial=True) is not None


@SETTINGS
@given(data=st.data(), pattern=regex_strategy())
def test_random_walks_match_brute_force_and_the_partial_match_oracle(data, pattern: str) -> None:
    matcher = compiled_matcher(pattern)
    produced = b""
    for _ in range(8):
        allowed = matcher.allowed_token_ids()
        np.testing.assert_array_equal(allowed, brute_force_allowed_ids(matcher))
        allowed_set = set(allowed.tolist())
        for token_id, token in enumerate(VOCABULARY.token_bytes):
            if not token or token_id in VOCABULARY.special_ids:
                continue
            expected = partial_oracle(pattern, produced, token)
            if expected is not None and produced.decode("utf-8", "ignore").encode() == produced:
                assert (token_id in allowed_set) == expected, (pattern, produced, token)
        if not len(allowed):
            break
        choice = int(allowed[data.draw(st.integers(0, len(allowed) - 1))])
        assert matcher.accept_token(choice)
        if choice == 0:
            break
        produced += VOCABULARY.token_bytes[choice]
    if matcher.is_terminated():
        assert re.fullmatch(pattern, produced.decode("utf-8"), re.ASCII), (pattern, produced)


CFGS = {
    "parens": ('root ::= "" | "(" root ")" root', lambda text: _balanced(text)),
    "json": (
        r"""root ::= value
        value ::= "null" | str | num | "true"
                | "{" ( pair ( "," pair )* )? "}" | "[" ( value ( "," value )* )? "]"
        pair ::= str ":" value
        str ::= "\"" [a-zé ]* "\""
        num ::= /-?(0|[1-9][0-9]*)(\.[0-9]+)?/""",
        lambda text: _is_json(text),
    ),
    "sum": (
        'root ::= term ("+" term)*\nterm ::= "1" | "x" | "(" root ")"',
        lambda text: _is_sum(text),
    ),
}


def _balanced(text: str) -> bool:
    depth = 0
    for character in text:
        depth += 1 if character == "(" else -1
        if depth < 0 or character not in "()":
            return False
    return depth == 0


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _is_sum(text: str) -> bool:
    if not re.fullmatch(r"[1x()+]+", text) or not _balanced(re.sub(r"[^()]", "", text)):
        return False
    try:
        return isinstance(eval(text.replace("x", "1")), int)
    except SyntaxError:
        return False


@SETTINGS
@given(data=st.data(), name=st.sampled_from(sorted(CFGS)))
def test_cfg_strings_are_accepted_and_walks_stay_in_the_language(data, name: str) -> None:
    text, reference = CFGS[name]
    grammar = Grammar.from_ebnf(text)
    sample = sample_string(
        grammar.rules, grammar.rules["root"], lambda n: data.draw(st.integers(0, n - 1))
    )
    assert reference(sample.decode("utf-8")), sample
    compiled = compile_grammar(grammar, VOCABULARY, disk_cache=False)
    matcher = GrammarMatcher(compiled)
    for token_id in greedy_tokenize(VOCABULARY, sample):
        assert matcher.accept_token(token_id), (name, sample)
    assert matcher.can_end()
    walker = GrammarMatcher(compiled)
    produced = b""
    for _ in range(30):
        allowed = walker.allowed_token_ids()
        np.testing.assert_array_equal(allowed, brute_force_allowed_ids(walker))
        choice = int(allowed[data.draw(st.integers(0, len(allowed) - 1))])
        assert walker.accept_token(choice)
        if choice == 0:
            assert reference(produced.decode("utf-8")), (name, produced)
            break
        produced += VOCABULARY.token_bytes[choice]


@given(st.lists(st.integers(0, 32 * 5 - 1), max_size=40), st.integers(5, 7))
@settings(max_examples=200, deadline=None)
def test_ids_to_bitmask_sets_exactly_the_bits_of_the_ids(ids: list[int], words: int) -> None:
    # Repeated ids included: each sets its one bit; bitmask_to_ids reads them back sorted.
    mask = ids_to_bitmask(np.array(ids, dtype=np.int64), words)
    assert mask.dtype == np.uint32 and mask.shape == (words,)
    assert bitmask_to_ids(mask.view(np.int32)).tolist() == sorted(set(ids))


def test_ids_to_bitmask_refuses_an_id_past_its_words() -> None:
    with pytest.raises(IndexError):
        ids_to_bitmask(np.array([64]), 2)
