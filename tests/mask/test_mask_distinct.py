"""Arrays whose string items are written once (formline.mask.distinct): repeats refused at
their last byte and, for enums, at their first, nothing else refused, the grammar's mask
kept when the policy would leave nothing, rollback, nested arrays; on the real SmolLM2
vocabulary and through the real decoding loop."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from helpers_mask import greedy_tokenize

from formline.constraint import Constraint
from formline.mask.bitmask import allocate_token_bitmask
from formline.mask.distinct import DistinctItemsMatcher
from formline.pipeline.generate import generate
from formline.pipeline.verbatim import distinct_arrays
from scripted import ScriptedEngine

NAMES = ["Kestrel Foods", "Kestrel Foods plc", "Northwind Analytics Ltd", "Ann"]


def parties_schema(items: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"parties": {"type": "array", "items": items}},
        "required": ["parties"],
        "additionalProperties": False,
    }


def matcher_for(
    vocabulary: Any, schema: dict[str, Any], whitespace: int | None = None
) -> DistinctItemsMatcher:
    plan = replace(Constraint.of(schema), whitespace=whitespace).compile(vocabulary)
    return DistinctItemsMatcher(plan.matcher(), distinct_arrays(schema))


def allowed(matcher: Any, size: int) -> set[int]:
    bitmask = allocate_token_bitmask(1, size)
    matcher.fill_next_token_bitmask(bitmask)
    flags = np.unpackbits(bitmask[0].view(np.uint8), bitorder="little")[:size]
    return set(np.flatnonzero(flags).tolist())


def feed(matcher: Any, vocabulary: Any, text: str) -> None:
    assert matcher.accept_tokens(greedy_tokenize(vocabulary, text.encode()))


def pieces_of(vocabulary: Any, tokens: set[int]) -> set[bytes]:
    return {vocabulary.token_bytes[token] for token in tokens}


def test_an_enum_item_written_once_cannot_start_or_end_again(smollm2_vocab: Any) -> None:
    matcher = matcher_for(smollm2_vocab, parties_schema({"type": "string", "enum": NAMES}))
    grammar = matcher.inner
    feed(matcher, smollm2_vocab, '{"parties":["Northwind Analytics Ltd","')
    size = smollm2_vocab.size
    narrowed, full = allowed(matcher, size), allowed(grammar, size)
    refused = pieces_of(smollm2_vocab, full - narrowed)
    assert narrowed < full
    assert refused and all(b"Kestrel".startswith(p) is False for p in refused)
    assert all(b"Northwind Analytics Ltd".startswith(piece) for piece in refused)
    feed(matcher, smollm2_vocab, 'Kestrel Foods","Kestrel Foods')
    closing = {t for t in allowed(grammar, size) if smollm2_vocab.token_bytes[t][:1] == b'"'}
    narrowed = allowed(matcher, size)
    assert closing and not closing & narrowed  # "Kestrel Foods" again: refused at its end
    assert pieces_of(smollm2_vocab, narrowed) & {b" ", b" p", b" pl"}  # " plc" still open


def scanning_every_allowed_token(matcher: DistinctItemsMatcher, size: int) -> set[int]:
    """The policy's mask by its definition: every token the grammar allows, checked."""
    inner = allowed(matcher.inner, size)
    array = matcher.follower.item_array()
    if array is None or not array.items:
        return inner
    choices = matcher._choices.get(array.path)
    pieces = matcher.inner.compiled.vocabulary.token_bytes
    refused = {token for token in inner if matcher._repeats(pieces[token], array.items, choices)}
    return inner - refused if refused and len(refused) < len(inner) else inner


@pytest.mark.parametrize(
    "items",
    [
        {"type": "string"},
        {"type": "string", "enum": NAMES},
        {"type": "string", "enum": ["Ann", "Kestrel Foods"]},  # every choice written, then
    ],
)
def test_the_policy_scans_only_what_can_repeat_and_refuses_the_same(
    smollm2_vocab: Any, items: dict[str, Any]
) -> None:
    # Only a token holding a quote can close or open an item, so only those are scanned
    # (an enum's prefix: every allowed token); the mask must be the full scan's, at every
    # byte of two repeats, spaced and not.
    matcher = matcher_for(smollm2_vocab, parties_schema(items), whitespace=4)
    size, checked, narrowed = smollm2_vocab.size, 0, 0
    for byte in b'{"parties": ["Ann", "Kestrel Foods", "Ann", "Kestrel Foods"]}':
        assert matcher.accept_string(bytes((byte,)))
        expected = scanning_every_allowed_token(matcher, size)
        assert allowed(matcher, size) == expected, bytes(matcher.follower.string)
        checked += matcher.follower.item_array() is not None
        narrowed += expected != allowed(matcher.inner, size)
    assert checked > 20 and narrowed >= 2  # the policy was at work, and refused


def test_once_every_choice_is_written_the_array_can_only_end(smollm2_vocab: Any) -> None:
    matcher = matcher_for(smollm2_vocab, parties_schema({"type": "string", "enum": ["Ann", "Bo"]}))
    size = smollm2_vocab.size
    feed(matcher, smollm2_vocab, '{"parties":["Ann"')
    assert allowed(matcher, size) == allowed(matcher.inner, size)  # "Bo" may follow
    feed(matcher, smollm2_vocab, ',"Bo"')
    narrowed, full = allowed(matcher, size), allowed(matcher.inner, size)
    refused = pieces_of(smollm2_vocab, full - narrowed)
    assert b"," in refused and all(b"," in piece for piece in refused)
    assert not any(b"," in piece for piece in pieces_of(smollm2_vocab, narrowed))
    assert b"]" in pieces_of(smollm2_vocab, narrowed)
    assert narrowed == scanning_every_allowed_token(matcher, size)


def test_a_choice_listed_twice_is_written_once(smollm2_vocab: Any) -> None:
    schema = parties_schema({"type": "string", "enum": ["Ann", "Ann", "Bo"]})
    matcher = matcher_for(smollm2_vocab, schema)
    feed(matcher, smollm2_vocab, '{"parties":["Ann","Bo"')
    narrowed = allowed(matcher, smollm2_vocab.size)
    assert not any(b"," in piece for piece in pieces_of(smollm2_vocab, narrowed))


def test_choices_written_while_min_items_asks_for_more_keep_the_grammar_mask(
    smollm2_vocab: Any,
) -> None:
    schema = parties_schema({"type": "string", "enum": ["Ann", "Bo"]})
    schema["properties"]["parties"]["minItems"] = 3
    matcher = matcher_for(smollm2_vocab, schema)
    feed(matcher, smollm2_vocab, '{"parties":["Ann","Bo"')
    size = smollm2_vocab.size
    assert allowed(matcher, size) == allowed(matcher.inner, size)  # a comma is all there is


def test_an_array_sharing_its_path_with_other_items_keeps_no_enum() -> None:
    closed = {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}}
    others = ({"type": "array", "items": {}}, {"type": "array", "prefixItems": [{}]})
    for other in (*others, {"type": "array"}):  # no items: anything
        schema = {"type": "object", "properties": {"tags": {"anyOf": [closed, other]}}}
        assert distinct_arrays(schema) == {("tags",): None}  # ',"c"' and ',3' stay open
    assert distinct_arrays({"properties": {"tags": closed}}) == {("tags",): ["a", "b"]}


def test_a_model_that_repeats_the_choices_ends_the_array_instead(llama_backend: Any) -> None:
    # The scripted model wants a comma after the last choice; refused, the array ends.
    engine = ScriptedEngine(llama_backend, '{"parties":["Ann","Bo","Ann","Bo"]}')
    schema = parties_schema({"type": "string", "enum": ["Ann", "Bo"]})
    result = generate("Ann and Bo signed.", schema, engine, max_tokens=40, verbatim=True)
    assert result.value == {"parties": ["Ann", "Bo"]}


def test_free_items_are_refused_only_when_complete(smollm2_vocab: Any) -> None:
    matcher = matcher_for(smollm2_vocab, parties_schema({"type": "string"}))
    feed(matcher, smollm2_vocab, '{"parties":["Ann","')
    size = smollm2_vocab.size
    assert allowed(matcher, size) == allowed(matcher.inner, size)  # "Ann" may begin "Anna"
    feed(matcher, smollm2_vocab, "Ann")
    refused = pieces_of(smollm2_vocab, allowed(matcher.inner, size) - allowed(matcher, size))
    assert refused and all(piece.startswith(b'"') for piece in refused)
    feed(matcher, smollm2_vocab, 'a"')  # "Anna" is another item
    assert matcher.follower.stack[-1].items == [b"Ann", b"Anna"]


def test_the_grammar_mask_is_kept_when_the_policy_would_leave_nothing(
    smollm2_vocab: Any,
) -> None:
    matcher = matcher_for(smollm2_vocab, parties_schema({"type": "string", "enum": ["Ann"]}))
    feed(matcher, smollm2_vocab, '{"parties":["Ann","Ann')  # forced text bypasses the mask
    size = smollm2_vocab.size
    assert allowed(matcher, size) == allowed(matcher.inner, size)


def test_rollback_forgets_the_items_it_undoes(smollm2_vocab: Any) -> None:
    matcher = matcher_for(smollm2_vocab, parties_schema({"type": "string", "enum": NAMES}))
    feed(matcher, smollm2_vocab, '{"parties":["')
    before = allowed(matcher, smollm2_vocab.size)
    tokens = greedy_tokenize(smollm2_vocab, b'Ann","')
    assert matcher.accept_tokens(tokens)
    assert allowed(matcher, smollm2_vocab.size) != before
    matcher.rollback(len(tokens))
    assert allowed(matcher, smollm2_vocab.size) == before
    matcher.reset()
    assert matcher.follower.stack == [] and not matcher.follower.in_string


def test_nested_arrays_are_tracked_per_instance(smollm2_vocab: Any) -> None:
    schema = {
        "type": "object",
        "properties": {
            "rows": {
                "type": "array",
                "items": {"$ref": "#/$defs/row"},
            }
        },
        "$defs": {
            "row": {
                "type": "object",
                "properties": {"tags": {"type": "array", "items": {"type": "string"}}},
            }
        },
    }
    assert distinct_arrays(schema) == {("rows", "*", "tags"): None}
    matcher = matcher_for(smollm2_vocab, schema)
    feed(matcher, smollm2_vocab, '{"rows":[{"tags":["Ann"]},{"tags":["Ann')
    size = smollm2_vocab.size
    assert allowed(matcher, size) == allowed(matcher.inner, size)  # another row's tags
    feed(matcher, smollm2_vocab, '","Ann')
    assert allowed(matcher, size) < allowed(matcher.inner, size)


def test_arrays_of_other_items_are_not_tracked() -> None:
    schema = {
        "type": "object",
        "properties": {
            "numbers": {"type": "array", "items": {"type": "integer"}},
            "either": {"anyOf": [{"type": "array", "items": {"type": "string", "enum": ["a"]}}]},
        },
    }
    assert distinct_arrays(schema) == {("either",): ["a"]}
    assert distinct_arrays(True) == {}


def test_extraction_writes_each_copied_party_once(llama_backend: Any) -> None:
    # The scripted model repeats "Ann"; under verbatim the second "Ann" cannot end there and
    # goes on to the next span of the text. (When the budget closes the array, the closing
    # text is the grammar's shortest and may repeat an item: the policy narrows only what
    # the model samples.)
    text = "Ann and Bo Ltd signed it."
    engine = ScriptedEngine(llama_backend, '{"parties":["Ann","Ann","Ann"]}')
    schema = parties_schema({"type": "string"})
    result = generate(text, schema, engine, max_tokens=40, verbatim=True, whitespace=None)
    assert result.data["parties"][:2] == ["Ann", "Ann and"]  # .data: it may be closed
    engine = ScriptedEngine(llama_backend, '{"parties":["Ann","Ann","Ann"]}')
    free = generate(text, schema, engine, max_tokens=40, whitespace=None)
    assert free.value["parties"] == ["Ann", "Ann", "Ann"]  # without verbatim, as written


def test_branches_that_disagree_leave_the_items_free() -> None:
    free = {"type": "array", "items": {"type": "string"}}
    closed = {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}}
    schema = {"type": "object", "properties": {"tags": {"anyOf": [free, closed]}}}
    assert distinct_arrays(schema) == {("tags",): None}  # "ab" stays open under the first
    schema = {"type": "object", "properties": {"tags": {"anyOf": [closed, closed]}}}
    assert distinct_arrays(schema) == {("tags",): ["a", "b"]}


def test_a_recursive_schema_is_walked_once_per_reference() -> None:
    parent = {"anyOf": [{"$ref": "#/$defs/person"}, {"type": "null"}]}
    schema = {
        "$ref": "#/$defs/person",
        "$defs": {
            "person": {
                "type": "object",
                "properties": {
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "mother": parent,
                    "father": parent,
                },
            }
        },
    }
    # Two self-references per level: a walk per path would be exponential in the depth.
    assert distinct_arrays(schema) == {("tags",): None}


def test_the_follower_reads_indented_json_raw_strings_and_repeats_within_a_token(
    smollm2_vocab: Any,
) -> None:
    matcher = matcher_for(smollm2_vocab, parties_schema({"type": "string"}), whitespace=16)
    assert matcher.accept_string('{\n  "parties": [\n    "Ann",\n    "Bo \\"B\\"",\n    "')
    assert matcher.follower.stack[-1].items == [b"Ann", b'Bo \\"B\\"']
    assert matcher.state_key()[1].endswith(b'"')  # the text written is part of the state
    size = smollm2_vocab.size
    # A token that writes "x", then opens and closes "x" again, repeats within itself.
    assert not matcher._repeats(b'x","', [b"Ann"], None)
    assert matcher._repeats(b'x","x"', [b"Ann"], None)
    assert matcher.accept_string("Ann")  # a third "Ann" may go on ("Anna"), not close
    refused = pieces_of(smollm2_vocab, allowed(matcher.inner, size) - allowed(matcher, size))
    assert refused and all(piece.startswith(b'"') for piece in refused)
    matcher.rollback(2)  # each raw string was one step: all of them are undone
    assert matcher.follower.stack == []
