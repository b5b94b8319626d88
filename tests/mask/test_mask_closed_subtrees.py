"""Differential: a walk that takes closed subtrees whole gives the brute-force mask.

A string's content state and its UTF-8 and escape states form a small closed piece of the
automaton; the kernel takes a trie node's whole subtree at once when no path below leaves
the piece (``closed_states`` counts the states that do). At every state along instances
that stop inside strings (after ASCII, mid UTF-8 character, after a backslash), in arrays
of strings (where the piece reaches past the quote) and in counted strings (no piece, and
walks borrowed from alike states), the native mask must equal the Python reference bit for
bit, on SmolLM2 and Qwen2.
"""

from __future__ import annotations

import string
from typing import Any

import numpy as np
import pytest

from formline import GrammarCompiler
from formline.grammar import Grammar
from formline.mask import GrammarMatcher
from formline.mask.reference import brute_force_allowed_ids
from formline.schema import compile_schema
from formline.vocab import Vocabulary
from formline.vocab.fixtures import fixture_path

OBJECT = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "bio": {"type": "string"}},
    "required": ["name", "bio"],
    "additionalProperties": False,
}
ARRAY = {"type": "array", "items": {"type": "string"}}
COUNTED = {"type": "string", "maxLength": 5}
PREFIXES = {
    "object": (OBJECT, ['{"name":"', '{"name":"Zo', '{"name":"Z\xfc', '{"name":"a\\']),
    "array": (ARRAY, ['["', '["a","', '["\u4e2d']),
    "counted": (COUNTED, ['"', '"ab']),
}


@pytest.fixture(scope="module", params=["smollm2", "qwen2"])
def vocabulary(request: Any) -> Vocabulary:
    return Vocabulary.from_gguf(fixture_path(request.param))


def matcher_at(compiled: Any, text: str) -> GrammarMatcher:
    """A matcher after ``text``'s bytes, cut mid UTF-8 character where asked (``\\xfc``:
    the first byte of ``ü``, ``\\u4e2d``: the first byte of ``中``)."""
    data = text.encode("utf-8")
    if "\xfc" in text or "\u4e2d" in text:
        data = data[: data.rfind(text[-1].encode("utf-8")) + 1]
    matcher = GrammarMatcher(compiled)
    assert matcher.accept_string(data)
    return matcher


@pytest.mark.parametrize("shape", sorted(PREFIXES))
def test_closed_subtree_walks_equal_brute_force(vocabulary: Vocabulary, shape: str) -> None:
    schema, prefixes = PREFIXES[shape]
    compiled = compile_schema(schema, vocabulary, disk_cache=False).compiled_grammar
    for text in prefixes:
        matcher = matcher_at(compiled, text)
        np.testing.assert_array_equal(matcher.allowed_token_ids(), brute_force_allowed_ids(matcher))
    closed = compiled.statistics.closed_states
    # A counted string has no state that loops on itself; the others take subtrees whole.
    assert (closed == 0) if shape == "counted" else (closed >= 3), closed


COUNTED_FIELDS = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 3, "maxLength": 24},
        "code": {"type": "string", "maxLength": 40},
    },
    "required": ["name", "code"],
    "additionalProperties": False,
}
# Positions early and late in each counted string (where tokens longer than what is left
# are refused), around minLength, and mid UTF-8 character.
COUNTED_PREFIXES = [
    '{"name":"A',
    '{"name":"Ad',
    '{"name":"Ada',
    '{"name":"Ada Lov',
    '{"name":"Ada Lovelace and',
    '{"name":"Ada Lovelace and Byr',
    '{"name":"Ada Lovelace and Byron!",',
    '{"name":"Ada","code":"x',
    '{"name":"Ada","code":"xy',
    '{"name":"Ada","code":"xyz \xfc',
    '{"name":"Ada","code":"' + "q" * 30,
]


def test_walks_that_borrow_from_an_alike_state_equal_brute_force(vocabulary: Vocabulary) -> None:
    compiled = compile_schema(COUNTED_FIELDS, vocabulary, disk_cache=False).compiled_grammar
    # Every position in turn (as decoding meets them), each checked against the reference.
    for text in COUNTED_PREFIXES:
        for cut in range(len(text) - 3, len(text) + 1):
            matcher_at(compiled, text[:cut]).allowed_token_ids()  # walk in decoding order
        matcher = matcher_at(compiled, text)
        np.testing.assert_array_equal(matcher.allowed_token_ids(), brute_force_allowed_ids(matcher))
    assert compiled.statistics.alike_walks >= 5, compiled.statistics


TAILED_FIELDS = {
    "type": "object",
    "properties": {
        "a": {"type": "string", "maxLength": 60},
        "b": {"type": "string", "maxLength": 40},
        "c": {"type": "string", "maxLength": 60},
    },
    "required": ["a", "b", "c"],
    "additionalProperties": False,
}


def test_a_string_value_borrows_the_walk_of_another_propertys_string(
    vocabulary: Vocabulary,
) -> None:
    # Each property's value is inlined in its own rule, so each closing quote leads to that
    # rule's own tail state; equal_depth takes two tails as alike, so the first positions of
    # "b" and "c" borrow from the walk of "a"'s second position (before: three full walks).
    compiled = compile_schema(TAILED_FIELDS, vocabulary, disk_cache=False).compiled_grammar
    borrowed = []
    for text in ['{"a":"', '{"a":"x', '{"a":"x","b":"', '{"a":"x","b":"y","c":"']:
        matcher = matcher_at(compiled, text)
        np.testing.assert_array_equal(matcher.allowed_token_ids(), brute_force_allowed_ids(matcher))
        borrowed.append(compiled.statistics.alike_walks)
    assert borrowed == [0, 1, 2, 3], compiled.statistics


def test_pieces_met_after_sixteen_others_still_take_subtrees_whole() -> None:
    # The token table keeps the 16 pieces used last (550 KB each on Llama-3). It kept the
    # first 16 for ever: a server's later grammars walked their loops without them.
    vocabulary = Vocabulary.from_gguf(fixture_path("smollm2"))
    compiler = GrammarCompiler(vocabulary, disk_cache=False)
    letters = string.ascii_letters
    for dropped in letters[:20]:  # 20 loops of 51 bytes each, all different pieces
        kept = "".join(letter for letter in letters if letter != dropped)
        compiled = compiler.compile_grammar(Grammar.from_regex(f"[{kept}]+;"))
        matcher = GrammarMatcher(compiled)
        assert matcher.accept_string(kept[:2])
        np.testing.assert_array_equal(matcher.allowed_token_ids(), brute_force_allowed_ids(matcher))
        assert compiled.statistics.closed_states >= 1, dropped
