"""Differential: the fast mask equals the brute-force mask on real vocabularies.

SmolLM2 (byte-level BPE, 49,152 tokens), phi-3 (SentencePiece with byte fallback, 32,064
tokens) and Qwen2 (byte-level BPE, 151,936). At random states reached by random walks, every
token is walked through the Python parser (``brute_force_allowed_ids``) and the result must
equal the native kernel's lazy mask bit for bit.
Canonically tokenized strings of each language must be accepted token by token and end.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers_mask import JSON_GBNF

from formline import GrammarCompiler
from formline.grammar import Grammar
from formline.mask import GrammarMatcher, compile_grammar
from formline.mask.reference import brute_force_allowed_ids
from formline.vocab import Vocabulary
from formline.vocab.fixtures import fixture_path

GRAMMARS = {
    "datetime": (
        Grammar.from_regex(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2})?(Z|[+-]\d{2}:\d{2})"),
        ["2024-02-29T13:45:07Z", "1999-12-31T23:59+05:30"],
    ),
    "choice": (
        Grammar.from_choices(["Portugal", "Indonesia", "Brasil", "Deutschland", "日本", "Perú"]),
        ["Indonesia", "日本", "Perú"],
    ),
    "json": (
        Grammar.from_gbnf(JSON_GBNF),
        [
            '{"name":"Ada Lovelace","age":36,"tags":["math","poetry"],"x":{"y":[1.5e3,null]}}',
            '[{"città":"Zürich 中文 ü","ok":true},-0.25,"a\\"b\\u00e9"]',
        ],
    ),
}


@pytest.fixture(scope="module", params=["smollm2", "phi-3", "qwen2"])
def vocabulary_and_tokenizer(request):
    from transformers import AutoTokenizer

    path = fixture_path(request.param)
    vocabulary = Vocabulary.from_gguf(path)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return request.param, vocabulary, tokenizer


def encode(name: str, tokenizer, text: str) -> list[int]:
    ids = tokenizer.encode(text, add_special_tokens=False)
    if name == "phi-3":
        # SentencePiece prefixes a "▁" (space) to the first word: drop that leading token or
        # piece, because the grammar's text starts without a space.
        piece = tokenizer.convert_ids_to_tokens(ids[0])
        if piece == "▁":
            ids = ids[1:]
        else:
            ids = tokenizer.encode("\n" + text, add_special_tokens=False)
            ids = ids[ids.index(tokenizer.convert_tokens_to_ids("<0x0A>")) + 1 :]
    return ids


@pytest.mark.parametrize("grammar_name", sorted(GRAMMARS))
def test_canonical_tokenizations_are_accepted(vocabulary_and_tokenizer, grammar_name) -> None:
    name, vocabulary, tokenizer = vocabulary_and_tokenizer
    grammar, texts = GRAMMARS[grammar_name]
    compiled = compile_grammar(grammar, vocabulary, disk_cache=False)
    for text in texts:
        ids = encode(name, tokenizer, text)
        assert b"".join(vocabulary.token_bytes[i] for i in ids) == text.encode("utf-8")
        matcher = GrammarMatcher(compiled)
        for token_id in ids:
            assert token_id in set(matcher.allowed_token_ids().tolist()), (text, token_id)
            assert matcher.accept_token(token_id), (text, token_id)
        assert matcher.can_end()
        assert matcher.accept_token(next(iter(vocabulary.eos_ids)))


@pytest.mark.parametrize("grammar_name", sorted(GRAMMARS))
def test_fast_mask_equals_brute_force_at_random_states(
    vocabulary_and_tokenizer, grammar_name
) -> None:
    name, vocabulary, tokenizer = vocabulary_and_tokenizer
    grammar, texts = GRAMMARS[grammar_name]
    compiled = compile_grammar(grammar, vocabulary, disk_cache=False)
    rng = np.random.default_rng(1234)
    checked = 0
    # States along a canonical tokenization (realistic), then along random walks (odd ones).
    matcher = GrammarMatcher(compiled)
    # The reference costs about 1.5 s per state on Qwen2's 151k tokens: fewer states there.
    prefix, walks, steps = (5, 1, 3) if name == "qwen2" else (12, 2, 6)
    for token_id in encode(name, tokenizer, texts[-1])[:prefix]:
        np.testing.assert_array_equal(matcher.allowed_token_ids(), brute_force_allowed_ids(matcher))
        checked += 1
        assert matcher.accept_token(token_id)
    for _ in range(walks):
        matcher = GrammarMatcher(compiled)
        for _ in range(steps):
            allowed = matcher.allowed_token_ids()
            np.testing.assert_array_equal(allowed, brute_force_allowed_ids(matcher))
            checked += 1
            choice = int(rng.choice(allowed))
            assert matcher.accept_token(choice)
            if matcher.is_terminated():
                break
    assert checked >= (3 if name == "qwen2" else 5)


def test_a_borrowed_piece_leaves_no_valid_token_out() -> None:
    # The walk skipped a subtree of the target state's own closed piece when its node was
    # still inside the start state's piece: [€-é-] then "{üa" left "  \\é" out of the mask
    # (accept_token took it).
    vocabulary = Vocabulary.from_list(
        [b"<eos>", "€-é-".encode(), "{üa".encode(), "  \\é".encode()], eos_ids=[0], vocab_size=4
    )
    compiled = GrammarCompiler(vocabulary).compile_grammar(Grammar.from_regex(r"([é-ü]|[^é]+)+a"))
    matcher = GrammarMatcher(compiled)
    assert matcher.accept_token(1) and matcher.accept_token(2)
    assert matcher.allowed_token_ids().tolist() == brute_force_allowed_ids(matcher).tolist()


def test_pieces_of_an_earlier_grammar_leave_no_valid_token_out(smollm2_vocab) -> None:
    # Pieces are shared through the vocabulary's token table: after a JSON string's, the
    # walk of this regex borrowed one and refused 89 valid tokens ('."', '("', ',"', ...).
    compiler = GrammarCompiler(smollm2_vocab)
    earlier = compiler.compile_json_schema({"type": "string"}).matcher()
    assert earlier.accept_string('"') and earlier.allowed_token_ids().size
    compiled = compiler.compile_grammar(Grammar.from_regex(r"(ab)?[^\n]*\n"))
    matcher = GrammarMatcher(compiled)
    assert matcher.allowed_token_ids().tolist() == brute_force_allowed_ids(matcher).tolist()
