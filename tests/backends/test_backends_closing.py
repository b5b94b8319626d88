"""Closing within the token budget: the shortest completion, written only when it must."""

from __future__ import annotations

from typing import Any

from formline.backends.base import CLOSING_MARGIN_TOKENS, closing_tokens
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
    assert closing_tokens(matcher, room, tokenize, smollm2_vocab.token_bytes) == []
    assert closing_tokens(matcher, needed - 1, tokenize, smollm2_vocab.token_bytes) == []
    forced = closing_tokens(matcher, needed + 1, tokenize, smollm2_vocab.token_bytes)
    assert b"".join(smollm2_vocab.token_bytes[token] for token in forced) == b'"]}'
    assert matcher.can_end()
