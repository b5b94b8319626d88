"""The matcher's decoding policies: closing within the token budget (the shortest
completion, written only when it must), jump-forward with back-off, the grammar's end."""

from __future__ import annotations

import random
from typing import Any

import pytest

from formline.automata import AutomatonLimitError
from formline.grammar import Grammar
from formline.grammar.budget import CompileBudget
from formline.mask.compiler import compile_grammar
from formline.mask.matcher import CLOSING_MARGIN_TOKENS, GrammarMatcher
from formline.schema import compile_schema
from formline.vocab import Vocabulary

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


TINY = Vocabulary.from_list([b"<eos>", b"(", b")", b"x", b"y", b"a", b"b"], eos_ids=[0])


def test_a_completion_search_leaves_a_branch_past_the_stack_limit() -> None:
    # After six "(" one byte's step needs more than 64 stacks: the error ended the search
    # (and the request, inside the closing window) though "x)y)x)y)x)y)" ends it.
    source = (
        'root ::= a\na ::= "(" a ")" b | "(" b ")" a | "x"\nb ::= "(" b ")" a | "(" a "))" | "y"'
    )
    matcher = GrammarMatcher(compile_grammar(Grammar.from_gbnf(source), TINY, disk_cache=False))
    assert matcher.accept_tokens([1] * 6)
    completion = matcher.shortest_completion()
    assert completion is not None and matcher.accept_string(completion) and matcher.can_end()


def test_an_empty_string_keeps_the_grammars_end() -> None:
    matcher = GrammarMatcher(compile_grammar(Grammar.from_regex("a+"), TINY, disk_cache=False))
    assert matcher.accept_string("a") and matcher.can_end()
    assert matcher.accept_string("") and matcher.can_end()  # it cleared can_end
    assert matcher.accept_token(0) and matcher.is_terminated()


def test_accept_tokens_takes_a_last_stop_token_where_the_grammar_ends() -> None:
    matcher = GrammarMatcher(compile_grammar(Grammar.from_regex("ab"), TINY, disk_cache=False))
    assert not matcher.accept_tokens([5, 0])  # "a" cannot end
    assert not matcher.accept_tokens([5, 0, 6])  # nothing after a stop token
    assert matcher.accept_tokens([5, 6, 0]) and matcher.is_terminated()
    matcher.rollback(3)
    assert matcher.accept_tokens([5, 6]) and matcher.accept_tokens([0])


def test_the_state_limit_is_an_error_not_a_refused_token() -> None:
    # Every a/b prefix is valid here; at the limit a new state's row read as dead, so a
    # valid token was refused (False) and the refusal cached.
    compiled = compile_grammar(
        Grammar.from_regex("[ab]*a[ab]{22}"), TINY, disk_cache=False,
        budget=CompileBudget(dfa_states=200),
    )  # fmt: skip
    matcher = GrammarMatcher(compiled)
    draw = random.Random(0)  # a/b drawn: each new 23-byte window is a new state
    with pytest.raises(AutomatonLimitError):
        for _ in range(400):
            assert matcher.accept_token(draw.choice([5, 6]))


def text_tokenizer(tokenizer: Any) -> Any:
    """A backend's ``tokenize`` over a Hugging Face tokenizer: bytes read as text."""

    def tokenize(text: bytes) -> list[int]:
        decoded = text.decode("utf-8", errors="replace")
        ids: list[int] = tokenizer.encode(decoded, add_special_tokens=False)
        return ids

    return tokenize


def test_a_completion_inside_a_character_is_spelled_from_its_bytes(
    smollm2_vocab: Any, smollm2_tokenizer: Any
) -> None:
    # After the token b"\xe4\xb8" the completion begins with b"\x80": tokenized as text it
    # came back replaced, and no closing was ever written.
    tokenize = text_tokenizer(smollm2_tokenizer)
    matcher = compile_schema(SCHEMA, smollm2_vocab, disk_cache=False).matcher()
    assert matcher.accept_string(b'{"parties":["A","')
    assert matcher.accept_token(smollm2_vocab.token_bytes.index(b"\xe4\xb8"))
    assert matcher.shortest_completion() == b'\x80"]}'
    closing = matcher.closing_tokens(3, tokenize)
    assert closing and matcher.accept_tokens(closing) and matcher.can_end()


def test_a_sentencepiece_tokenizers_prefix_space_does_not_stop_closing(
    phi3_vocab: Any, phi3_tokenizer: Any
) -> None:
    # phi-3 tokenizes '"]}' as ' "', ']}': no closing or forced text was ever written.
    tokenize = text_tokenizer(phi3_tokenizer)
    matcher = compile_schema(SCHEMA, phi3_vocab, disk_cache=False).matcher()
    forced = matcher.jump_forward_tokens(tokenize, 50)
    assert b"".join(phi3_vocab.token_bytes[token] for token in forced) == b'{"parties":["'
    assert matcher.accept_string(b'{"parties":["A","B","C')
    closing = matcher.closing_tokens(3, tokenize)
    assert closing and matcher.accept_tokens(closing) and matcher.can_end()
