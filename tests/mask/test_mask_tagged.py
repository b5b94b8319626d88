"""A rationale, then the grammar: the tagged matcher's free mask, its trigger, its budget,
and the rationale kept apart from the answer, through the real decoding loop and the real
SmolLM2 tokenizer."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from pydantic import BaseModel

from formline.constraint import Constraint
from formline.mask.bitmask import allocate_token_bitmask
from formline.mask.matcher import TokenError
from formline.mask.tagged import TagError, TaggedMatcher
from formline.pipeline.decoding import Sampling, decode
from formline.pipeline.generate import GenerationRequest, Shaping, generate
from scripted import ScriptedEngine

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
PROMPT = "<|im_start|>user\nWho?<|im_end|>\n<|im_start|>assistant\n"


class Person(BaseModel):
    name: str
    age: int


def person_compiled(vocabulary: Any) -> Any:
    return Constraint.of(PERSON).compile(vocabulary).compiled


def allowed(matcher: TaggedMatcher, size: int) -> set[int]:
    bitmask = allocate_token_bitmask(1, size)
    matcher.fill_next_token_bitmask(bitmask)
    words = bitmask[0].view("<u4")
    return {token for token in range(size) if words[token >> 5] >> (token & 31) & 1}


def test_the_free_mask_refuses_stops_and_misused_triggers(smollm2_vocab: Any) -> None:
    matcher = TaggedMatcher(person_compiled(smollm2_vocab), free_tokens=8)
    pieces = smollm2_vocab.token_bytes
    free = allowed(matcher, smollm2_vocab.size)
    assert not free & (smollm2_vocab.eos_ids | smollm2_vocab.special_ids)
    plain = next(t for t, piece in enumerate(pieces) if piece == b" the")
    opening = next(t for t, piece in enumerate(pieces) if piece == b"{")
    empty = next(t for t, piece in enumerate(pieces) if piece == b"{}")
    assert {plain, opening} <= free and empty not in free  # {} lacks the required fields
    # Every token with a "{" in it that the mask allows starts the grammar from there.
    for token in free:
        if b"{" in pieces[token]:
            assert pieces[token][pieces[token].index(b"{") :].startswith(b'{"') or pieces[
                token
            ].endswith(b"{")


def test_free_steps_name_ids_outside_the_vocabulary_and_empty_openings(
    smollm2_vocab: Any,
) -> None:
    matcher = TaggedMatcher(person_compiled(smollm2_vocab), free_tokens=8)
    for token in (-1, smollm2_vocab.size, 10**6):  # -1 read bit 31 of the last mask word
        with pytest.raises(TokenError):
            matcher.accept_token(token)
    plain = smollm2_vocab.token_bytes.index(b" the")
    assert matcher.accept_token(plain) and matcher.accept_tokens([])
    matcher.rollback(1)  # the empty opening was an event: this undid it, not " the"
    assert matcher.free_used == 0 and not matcher.is_answering
    with pytest.raises(ValueError, match="cannot roll back"):
        matcher.rollback(1)


def test_the_trigger_opens_the_answer_and_the_rationale_stays_apart(llama_backend: Any) -> None:
    vocabulary = llama_backend.vocabulary
    engine = ScriptedEngine(llama_backend, 'She was thirty-six.\n{"name":"Ada","age":36}')
    matcher = TaggedMatcher(person_compiled(vocabulary), free_tokens=40)
    result = decode(engine, PROMPT, matcher, Sampling(max_tokens=60))
    assert matcher.rationale == "She was thirty-six.\n"
    assert result.text == 'She was thirty-six.\n{"name":"Ada","age":36}'
    assert result.finish_reason == "stop" and matcher.is_answering


def test_the_budget_opens_the_answer_and_it_still_validates(llama_backend: Any) -> None:
    engine = ScriptedEngine(llama_backend, "A very long rationale that goes on and on and on.")
    matcher = TaggedMatcher(person_compiled(llama_backend.vocabulary), free_tokens=3)
    result = decode(engine, PROMPT, matcher, Sampling(max_tokens=40))
    rationale = matcher.rationale_bytes
    assert matcher.free_used == 3 and rationale == b"A very long"
    answer = result.text.encode()[len(rationale) :].decode()
    jsonschema.validate(json.loads(answer), PERSON)  # closed within the budget


def test_generate_with_think_returns_the_value_and_the_rationale(llama_backend: Any) -> None:
    engine = ScriptedEngine(llama_backend, 'Ada is thirty-six.\n{"name":"Ada","age":"thirty-six"}')
    result = generate(
        "Ada Lovelace was thirty-six.", Person, engine, think=24, numbers="tolerant",
        describe_schema="fields", max_tokens=40,
    )  # fmt: skip
    assert result.value == Person(name="Ada", age=36)
    assert result.rationale == "Ada is thirty-six.\n" and result.coerced == ["age"]
    assert result.text == '{"name":"Ada","age":"thirty-six"}'
    request = GenerationRequest.prepare(
        "Ada Lovelace was thirty-six.", Person, engine, Sampling(),
        describe_schema="fields", shaping=Shaping(think=24),
    )  # fmt: skip
    assert "- age (integer)" in request.prompt and "Before the JSON" in request.prompt


def test_a_grammar_without_a_fixed_first_byte_cannot_think(smollm2_vocab: Any) -> None:
    compiled = Constraint("choice", ["yes", "no"]).compile(smollm2_vocab).compiled
    with pytest.raises(TagError, match="one fixed"):
        TaggedMatcher(compiled, free_tokens=8)
