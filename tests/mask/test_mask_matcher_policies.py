"""The matcher's decoding policies: closing within the token budget (the shortest
completion, written only when it must), jump-forward with back-off, the grammar's end."""

from __future__ import annotations

from typing import Any

from formline.grammar import Grammar
from formline.mask.compiler import compile_grammar
from formline.mask.matcher import CLOSING_MARGIN_TOKENS, GrammarMatcher
from formline.schema import compile_schema

SCHEMA = {
    "type": "object",
    "properties": {"parties": {"type": "array", "items": {"type": "string"}, "minItems": 2}},
    "required": ["parties"],
    "additionalProperties": False,
}


def test_shortest_completion_is_the_shortest_valid_ending(smollm2_vocab: Any) -> None:
    matcher = compile_schema(SCHEMA, smollm2_vocab, disk_cache=False).matcher()
    assert matcher.shortest_completion() == b'{"parties":["",""]}'
    assert matcher.accept_string(b'{"parties":["The Supplier","The Sup')
    assert matcher.shortest_completion() == b'"]}'
    assert matcher.accept_string(b'"]}')
    assert matcher.shortest_completion() == b""


def test_closing_tokens_only_when_the_completion_just_fits(
    smollm2_vocab: Any, smollm2_tokenizer: Any
) -> None:
    matcher = compile_schema(SCHEMA, smollm2_vocab, disk_cache=False).matcher()
    assert matcher.accept_string(b'{"parties":["A","B","C')

    def tokenize(text: bytes) -> list[int]:
        ids: list[int] = smollm2_tokenizer.encode(text.decode(), add_special_tokens=False)
        return ids

    needed = len(tokenize(b'"]}'))
    room = needed + CLOSING_MARGIN_TOKENS + 5
    assert matcher.closing_tokens(room, tokenize) == []
    assert matcher.closing_tokens(needed - 1, tokenize) == []
    forced = matcher.closing_tokens(needed + 1, tokenize)
    assert b"".join(smollm2_vocab.token_bytes[token] for token in forced) == b'"]}'
    assert not matcher.can_end()  # computed, not accepted: the loop feeds them
    assert matcher.accept_tokens(forced) and matcher.can_end() and matcher.is_only_stop_allowed()


def hf_tokenize(tokenizer: Any) -> Any:
    def tokenize(text: bytes) -> list[int]:
        ids: list[int] = tokenizer.encode(text.decode(), add_special_tokens=False)
        return ids

    return tokenize


def test_jump_forward_backs_off_a_token_the_model_would_merge(
    smollm2_vocab: Any, smollm2_tokenizer: Any
) -> None:
    grammar = Grammar.from_regex("The capital of (France|Spain)\\.")
    matcher = GrammarMatcher(compile_grammar(grammar, smollm2_vocab, disk_cache=False))
    tokenize = hf_tokenize(smollm2_tokenizer)
    alone = tokenize(b"The capital of ")
    assert smollm2_vocab.token_bytes[alone[-1]] == b" "  # the lone space a model never writes
    tokens = matcher.jump_forward_tokens(tokenize, room=64)
    assert b"".join(smollm2_vocab.token_bytes[token] for token in tokens) == b"The capital of"
    assert matcher.find_jump_forward_string() == "The capital of "  # the state is unchanged
    assert matcher.jump_forward_tokens(tokenize, room=64, back_off=0) == alone
    assert matcher.jump_forward_tokens(tokenize, room=2) == alone[:2]
    assert matcher.jump_forward_tokens(tokenize, room=0) == []
    assert matcher.accept_tokens(tokens) and matcher.accept_token(tokenize(b" France")[0])


def test_jump_forward_refuses_tokens_that_do_not_spell_the_text(smollm2_vocab: Any) -> None:
    matcher = GrammarMatcher(compile_grammar(Grammar.from_regex("abc"), smollm2_vocab))
    space = smollm2_vocab.token_id(b" ")
    assert matcher.jump_forward_tokens(lambda text: [space], room=8) == []
    assert matcher.jump_forward_tokens(lambda text: [10**9], room=8) == []


def test_accept_tokens_is_all_or_nothing(smollm2_vocab: Any) -> None:
    matcher = GrammarMatcher(compile_grammar(Grammar.from_regex("ab"), smollm2_vocab))
    a, b = smollm2_vocab.token_id(b"a"), smollm2_vocab.token_id(b"b")
    assert not matcher.accept_tokens([a, a]) and matcher.find_jump_forward_string() == "ab"
    assert not matcher.is_only_stop_allowed()
    assert matcher.accept_tokens([a, b]) and matcher.is_only_stop_allowed()
