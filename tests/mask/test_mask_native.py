"""The native core: lazy kernel masks against the reference, the compiler object under threads,
the batch fill, the byte-bounded caches and the disk store's eviction."""

from __future__ import annotations

import dataclasses
import gc
import os
import threading
from pathlib import Path

import numpy as np
import pytest
from helpers_mask import greedy_tokenize, synthetic_vocabulary

from formline import GrammarCompiler
from formline.grammar import Grammar
from formline.grammar.budget import CompileBudget
from formline.mask import (
    BatchGrammarMatcher,
    CompileCache,
    GrammarMatcher,
    allocate_token_bitmask,
    compile_grammar,
    storage,
)
from formline.mask import compiler as compiler_module
from formline.mask.bitmask import bitmask_to_ids
from formline.mask.compiled import CompiledGrammar
from formline.mask.reference import brute_force_allowed_ids
from formline.native import NativeMaskKernel, NativeTokenTable, fill_masks
from formline.parser.pushdown import ParserLimitError
from formline.vocab import Vocabulary
from formline.vocab.fixtures import fixture_path

VOCABULARY = synthetic_vocabulary()
OPEN = VOCABULARY.token_bytes.index(b"(")

# A called whitespace rule that can end at once: most tokens starting with a space leave it
# part-way, so nearly every mask needs the escape leftovers checked against the stack below.
ESCAPE_HEAVY = r"""
root ::= "[" ws ( item ( ws "," ws item )* )? ws "]"
item ::= "(" ws ( item ws )* ")" | /[a-z]+/ | "12" | "1"
ws ::= [ ]*
"""

SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "tags": {"type": "array", "items": {"enum": ["a", "ab", "b"]}, "maxItems": 3},
            "size": {"type": "integer", "minimum": -5, "maximum": 120},
        },
        "required": ["name"],
    },
    {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "v": {"type": "number"},
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
                "required": ["v"],
                "additionalProperties": False,
            }
        },
        "$ref": "#/$defs/node",
    },
]


# Two string fields: each one's content, escape and UTF-8 states are a closed piece.
TWO_STRINGS = {
    "type": "object",
    "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}


def walk_and_compare(matcher: GrammarMatcher, rng: np.random.Generator, steps: int) -> int:
    """Random walk: at each state the kernel's mask must equal the reference."""
    checked = 0
    for _ in range(steps):
        allowed = matcher.allowed_token_ids()
        np.testing.assert_array_equal(allowed, brute_force_allowed_ids(matcher))
        checked += 1
        if matcher.is_terminated() or not len(allowed):
            break
        assert matcher.accept_token(int(rng.choice(allowed)))
    return checked


@pytest.mark.parametrize("seed", range(6))
def test_escape_heavy_grammar_masks_equal_the_reference(seed) -> None:
    compiled = compile_grammar(Grammar.from_ebnf(ESCAPE_HEAVY), VOCABULARY, disk_cache=False)
    assert walk_and_compare(GrammarMatcher(compiled), np.random.default_rng(seed), 25) >= 3
    matcher = GrammarMatcher(compiled)
    for token_id in greedy_tokenize(VOCABULARY, b"[ ab , ( x ( 12 ) ) ,1]"):
        np.testing.assert_array_equal(matcher.allowed_token_ids(), brute_force_allowed_ids(matcher))
        assert matcher.accept_token(token_id)
    assert matcher.can_end()


@pytest.mark.parametrize("schema_index", range(len(SCHEMAS)))
def test_schema_masks_equal_the_reference_on_smollm2(smollm2_vocab, schema_index) -> None:
    compiler = GrammarCompiler(smollm2_vocab, disk_cache=False)
    compiled = compiler.compile_json_schema(SCHEMAS[schema_index])
    rng = np.random.default_rng(schema_index)
    checked = sum(walk_and_compare(compiled.matcher(), rng, 8) for _ in range(2))
    assert checked >= 4


def test_string_states_taking_their_piece_whole_equal_the_reference(smollm2_vocab) -> None:
    # An unbounded string's content, escape and UTF-8 states are a closed piece: their walks
    # take the tokens that never leave it from one per-vocabulary mask and walk only the
    # rest. Two fields share the piece; the second compile reuses the first's masks.
    # In the content, after a backslash, inside a two-byte character, in the second field.
    prefixes = [b'{"a":"', b'{"a":"x\\', b'{"a":"\xc3', b'{"a":"q","b":"', b'{"a":"q","b":"\\u00']
    compiler = GrammarCompiler(smollm2_vocab, disk_cache=False)
    for _ in range(2):
        compiled = compiler.compile_json_schema(TWO_STRINGS)
        for prefix in prefixes:
            matcher = compiled.matcher()
            assert matcher.accept_string(prefix)
            np.testing.assert_array_equal(
                matcher.allowed_token_ids(), brute_force_allowed_ids(matcher), err_msg=str(prefix)
            )
        # Pieces are found as walks first meet their states: both fields' contents, by now.
        assert compiled.compiled_grammar.statistics.closed_states >= 2
        compiler.clear_cache()


def test_two_string_fields_pieces_hold_their_states_and_transitions(smollm2_vocab) -> None:
    # The masks cannot show a piece's table: a member or a transition lost from it only makes
    # the walks visit more of the trie. Each field's content, escape and UTF-8 states: 14
    # states, 505 byte transitions among them (the search found the same tables on all 300
    # MaskBench schemas before and after it was made faster).
    compiled = GrammarCompiler(smollm2_vocab, disk_cache=False).compile_json_schema(TWO_STRINGS)
    for prefix in (b'{"a":"', b'{"a":"q","b":"'):
        matcher = compiled.matcher()
        assert matcher.accept_string(prefix)
        matcher.allowed_token_ids()
    statistics = compiled.compiled_grammar.statistics
    assert (statistics.closed_states, statistics.piece_transitions) == (28, 1010)


def test_a_compile_after_a_freed_one_reads_none_of_its_states(smollm2_vocab) -> None:
    # A freed grammar's automaton and mask kernel give their per-state arrays back to the
    # thread (native MappedArrayPool), zeroed over the states made, for the next compile: a
    # piece, a row or a flag of the first may not show through in the second's masks.
    compiler = GrammarCompiler(smollm2_vocab, disk_cache=False)
    rng = np.random.default_rng(7)
    first = compiler.compile_json_schema(SCHEMAS[1])
    matcher = first.matcher()
    assert matcher.accept_string(b'{"v":1,"kids":[{"v":2,"kids":[]},{"v":3')
    matcher.allowed_token_ids()
    first.compiled_grammar.automaton.tables()  # every state made
    del first, matcher
    compiler.clear_cache()
    gc.collect()
    second = compiler.compile_json_schema(SCHEMAS[0])
    checked = sum(walk_and_compare(second.matcher(), rng, 10) for _ in range(3))
    assert checked >= 6


def test_number_states_before_many_optional_members_equal_the_reference() -> None:
    # Forty optional integers: after every digit the walk's closure expands the member rules
    # still to come (a stack each), and under Llama-3's multi-digit tokens ("1", "12",
    # "123") it meets the same raw configurations again: walk.hpp's ClosureMemo copies
    # those. SmolLM2 writes one digit a token, so it would not reach the memo.
    vocabulary = Vocabulary.from_gguf(fixture_path("llama-bpe"))
    schema = {
        "type": "object",
        "properties": {f"p{index}": {"type": "integer"} for index in range(40)},
        "additionalProperties": False,
    }
    compiled = GrammarCompiler(vocabulary, disk_cache=False).compile_json_schema(schema)
    for prefix in (b'{"p0":', b'{"p0":12,"p7":-3', b'{"p0":12,"p38":'):
        matcher = compiled.matcher()
        assert matcher.accept_string(prefix)
        allowed = matcher.allowed_token_ids()
        assert len(allowed) > 900  # Llama-3's numbers of up to three digits, at least
        np.testing.assert_array_equal(allowed, brute_force_allowed_ids(matcher), str(prefix))


def test_counted_string_first_positions_take_a_bounded_piece_and_equal_the_reference(
    smollm2_vocab,
) -> None:
    # A counted string's first position is in no loop, yet reads as the unbounded string's
    # content for up to maxLength bytes: its walk takes the piece's mask for the tokens that
    # short (the piece comes from another grammar on the same vocabulary) and walks the rest.
    compiler = GrammarCompiler(smollm2_vocab, disk_cache=False)
    compiler.compile_json_schema({"type": "string"})  # the string piece, on the token table
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "string", "maxLength": 10},
            "b": {"type": "string", "maxLength": 40},
            "c": {"type": "string", "minLength": 1},
        },
        "required": ["a", "b", "c"],
        "additionalProperties": False,
    }
    prefixes = [b'{"a":"', b'{"a":"x","b":"', b'{"a":"x","b":"y","c":"', b'{"a":"xy']
    compiled = compiler.compile_json_schema(schema)
    allowed_after: dict[bytes, set[int]] = {}
    for prefix in prefixes:
        matcher = compiled.matcher()
        assert matcher.accept_string(prefix)
        allowed = matcher.allowed_token_ids()
        expected = brute_force_allowed_ids(matcher)
        np.testing.assert_array_equal(allowed, expected, err_msg=str(prefix))
        allowed_after[prefix] = set(allowed.tolist())
    assert compiled.compiled_grammar.statistics.bounded_walks >= 3
    allowed_at_start = allowed_after[b'{"a":"']
    # The bound matters: plain words of 11 bytes or more do not fit maxLength 10.
    words = [
        token_id
        for token_id, data in enumerate(smollm2_vocab.token_bytes)
        if data.isalpha() and data.isascii()
    ]
    assert any(len(smollm2_vocab.token_bytes[t]) > 10 for t in words)
    assert all((t in allowed_at_start) == (len(smollm2_vocab.token_bytes[t]) <= 10) for t in words)


def test_two_threads_compiling_different_schemas_agree_with_one(smollm2_vocab) -> None:
    shared = GrammarCompiler(smollm2_vocab, disk_cache=False)
    results: dict[int, object] = {}
    errors: list[BaseException] = []

    def compile_one(index: int) -> None:
        try:
            results[index] = shared.compile_json_schema(SCHEMAS[index])
        except BaseException as error:  # reported below, not swallowed
            errors.append(error)

    threads = [threading.Thread(target=compile_one, args=(k,)) for k in range(len(SCHEMAS))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors and len(results) == len(SCHEMAS)
    alone = GrammarCompiler(smollm2_vocab, disk_cache=False)
    for index, schema in enumerate(SCHEMAS):
        parallel = results[index].compiled_grammar  # type: ignore[attr-defined]
        single = alone.compile_json_schema(schema).compiled_grammar
        np.testing.assert_array_equal(parallel.automaton.transitions, single.automaton.transitions)
        one, other = GrammarMatcher(parallel), GrammarMatcher(single)
        rng = np.random.default_rng(index)
        for _ in range(10):
            allowed = one.allowed_token_ids()
            np.testing.assert_array_equal(allowed, other.allowed_token_ids())
            if not len(allowed) or one.is_terminated():
                break
            token = int(rng.choice(allowed))
            assert one.accept_token(token) and other.accept_token(token)


def test_the_same_grammar_asked_by_many_threads_is_compiled_once() -> None:
    cache = CompileCache(disk_cache=False)
    grammar = Grammar.from_regex(r"[a-c]{2,9}(x|yz)+")
    found: list[object] = []
    threads = [
        threading.Thread(target=lambda: found.append(cache.compile(grammar, VOCABULARY)))
        for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(found) == 8 and all(item is found[0] for item in found)


def test_batch_fill_equals_one_matcher_at_a_time(smollm2_vocab) -> None:
    compiled = GrammarCompiler(smollm2_vocab, disk_cache=False).compile_json_schema(SCHEMAS[0])
    rng = np.random.default_rng(7)
    matchers = []
    for row in range(24):  # rows at different depths of different random walks
        matcher = compiled.matcher()
        for _ in range(row % 9):
            allowed = matcher.allowed_token_ids()
            if matcher.is_terminated() or not len(allowed):
                break
            assert matcher.accept_token(int(rng.choice(allowed)))
        matchers.append(matcher)
    compiled.compiled_grammar.clear_mask_cache()
    batch = BatchGrammarMatcher(max_threads=2)
    bitmask = allocate_token_bitmask(30, smollm2_vocab.size)
    rows = list(range(29, 5, -1))  # indices out of order, rows 0-5 left as they were
    batch.batch_fill_next_token_bitmask(matchers, bitmask, rows)
    for matcher, row in zip(matchers, rows, strict=True):
        expected = allocate_token_bitmask(1, smollm2_vocab.size)
        matcher.fill_next_token_bitmask(expected)
        np.testing.assert_array_equal(bitmask[row], expected[0])
    assert (bitmask[:6] == -1).all()
    strided = np.repeat(np.array(rows, dtype=np.int64), 2)[::2]  # a view, not C-contiguous
    again = allocate_token_bitmask(30, smollm2_vocab.size)
    batch.batch_fill_next_token_bitmask(matchers, again, strided)  # every row cached now
    np.testing.assert_array_equal(again, bitmask)
    with pytest.raises(ValueError, match="outside the bitmask's 3 rows"):
        batch.batch_fill_next_token_bitmask(matchers[:4], bitmask[:3])
    with pytest.raises(ValueError, match="indices"):
        batch.batch_fill_next_token_bitmask(matchers, bitmask, rows[:-1])
    with pytest.raises(ValueError, match="outside"):
        batch.batch_fill_next_token_bitmask(matchers[:1], bitmask, [30])
    with pytest.raises(ValueError, match="row 7 is named twice"):  # two threads, one row
        batch.batch_fill_next_token_bitmask(matchers[:3], bitmask, [7, 8, 7])
    batch.close()


def test_batch_rows_in_one_counted_string_equal_single_fills(smollm2_vocab) -> None:
    # Positions of a counted string share a row shape: the batch walks one, defers its mates
    # on the other thread and walks them from it; the masks must not change for that.
    schema = {"type": "object", "properties": {"note": {"type": "string", "maxLength": 40}}}
    text = '{"note":"' + "abcdefghij" * 3
    compiler = GrammarCompiler(smollm2_vocab, disk_cache=False)
    compiled = compiler.compile_json_schema(schema)
    matchers = []
    for length in range(9, len(text) + 1):
        matcher = compiled.matcher()
        assert matcher.accept_string(text[:length])
        matchers.append(matcher)
    batch = BatchGrammarMatcher(max_threads=2)
    bitmask = allocate_token_bitmask(len(matchers), smollm2_vocab.size)
    batch.batch_fill_next_token_bitmask(matchers, bitmask)
    batch.close()
    fresh = GrammarCompiler(smollm2_vocab, disk_cache=False).compile_json_schema(schema)
    for row, length in enumerate(range(9, len(text) + 1)):
        single = fresh.matcher()
        assert single.accept_string(text[:length])
        expected = allocate_token_bitmask(1, smollm2_vocab.size)
        single.fill_next_token_bitmask(expected)
        np.testing.assert_array_equal(bitmask[row], expected[0], err_msg=f"prefix {length}")


def test_one_batch_of_two_grammars_equals_the_reference(smollm2_vocab) -> None:
    # Rows of two compiled grammars share the native queue; duplicate rows are filled once.
    compiler = GrammarCompiler(smollm2_vocab, disk_cache=False)
    first = compiler.compile_json_schema(SCHEMAS[0]).compiled_grammar
    second = compiler.compile_grammar(Grammar.from_regex(r"[a-z]{2,8}(, [a-z]{2,8})*"))
    prefixes = [(first, '{"name":"ab'), (second, "abc, d"), (first, '{"name":"ab'), (second, "")]
    matchers = []
    for compiled, text in prefixes:
        matcher = GrammarMatcher(compiled)
        assert matcher.accept_string(text)
        matchers.append(matcher)
    bitmask = allocate_token_bitmask(len(matchers), smollm2_vocab.size)
    BatchGrammarMatcher(max_threads=2).batch_fill_next_token_bitmask(matchers, bitmask)
    for row, (_, text) in enumerate(prefixes):
        expected = brute_force_allowed_ids(matchers[row])
        np.testing.assert_array_equal(
            np.flatnonzero(np.unpackbits(bitmask[row].view(np.uint8), bitorder="little")),
            expected,
            err_msg=f"row {row} ({text!r})",
        )


def test_an_empty_batch_writes_no_row(smollm2_vocab) -> None:
    # vLLM's processor passes no matcher on a step where every row is forced or closed.
    bitmask = allocate_token_bitmask(2, smollm2_vocab.size)
    bitmask[:] = 7
    BatchGrammarMatcher(max_threads=2).batch_fill_next_token_bitmask([], bitmask)
    assert (bitmask == 7).all()
    # A bitmask of no rows: nothing to write, and nothing may raise (an IndexError on a
    # first matcher, or a copy to a row that is not there).
    no_rows = np.zeros((0, bitmask.shape[1]), dtype=np.int32)
    BatchGrammarMatcher(max_threads=2).batch_fill_next_token_bitmask([], no_rows)


def test_the_native_batch_checks_its_arguments(smollm2_vocab) -> None:
    compiled = GrammarCompiler(smollm2_vocab, disk_cache=False).compile_json_schema(SCHEMAS[0])
    grammar = compiled.compiled_grammar
    stacks, can_end, _ = compiled.matcher().state_key()
    with pytest.raises(ValueError, match="differ in length"):
        fill_masks([grammar.kernel], [stacks], [can_end], [], 2)
    short = np.empty(grammar.words - 1, dtype=np.uint32)
    with pytest.raises(ValueError, match="words"):
        fill_masks([grammar.kernel], [stacks], [can_end], [short], 2)


def test_a_batch_of_two_grammars_with_cached_new_and_ended_rows_equals_single_fills(
    smollm2_vocab,
) -> None:
    # Rows of two grammars (each looked up in its own cache, and its new masks remembered
    # there), one terminated (only a stop token), some cached by an earlier fill, the rest new.
    grammars = {
        "choices": Grammar.from_choices(["yes", "no", "maybe"]),
        "counted": Grammar.from_regex("[a-z]{0,12};"),
    }
    compiler = GrammarCompiler(smollm2_vocab, disk_cache=False)
    compiled = {name: compiler.compile_grammar(grammar) for name, grammar in grammars.items()}
    texts = [
        ("choices", ""),
        ("counted", "ab"),
        ("choices", "ma"),
        ("counted", ""),
        ("counted", "abc"),
    ]
    matchers = []
    for name, text in texts:
        matcher = GrammarMatcher(compiled[name])
        assert matcher.accept_string(text)
        matchers.append(matcher)
    ended = GrammarMatcher(compiled["choices"])
    assert ended.accept_string("no") and ended.accept_token(min(smollm2_vocab.eos_ids))
    matchers.append(ended)
    matchers[0].next_token_mask_words()  # cached before the batch
    matchers[1].next_token_mask_words()
    bitmask = allocate_token_bitmask(len(matchers), smollm2_vocab.size)
    BatchGrammarMatcher(max_threads=2).batch_fill_next_token_bitmask(matchers, bitmask)
    for row, (name, text) in enumerate(texts):
        fresh = GrammarCompiler(smollm2_vocab, disk_cache=False).compile_grammar(grammars[name])
        single = GrammarMatcher(fresh)
        assert single.accept_string(text)
        expected = allocate_token_bitmask(1, smollm2_vocab.size)
        single.fill_next_token_bitmask(expected)
        np.testing.assert_array_equal(bitmask[row], expected[0], err_msg=f"row {row}")
    assert set(bitmask_to_ids(bitmask[5]).tolist()) == set(smollm2_vocab.eos_ids)
    for matcher in matchers[:5]:  # each grammar remembered its own rows' masks
        stacks, can_end, _ = matcher.state_key()
        assert matcher.compiled.cached_mask(stacks, can_end) is not None


def test_a_batch_keeps_the_mask_cache_to_its_entries_oldest_out_first(smollm2_vocab) -> None:
    compiled = GrammarCompiler(smollm2_vocab, disk_cache=False).compile_grammar(
        Grammar.from_regex("[a-z]{0,40};")
    )
    small = dataclasses.replace(compiled, mask_cache_bytes=0)  # the floor: 16 masks
    matchers = []
    for length in range(21):  # 21 distinct configurations, one per count
        matcher = GrammarMatcher(small)
        assert matcher.accept_string("a" * length)
        matchers.append(matcher)
    batch = BatchGrammarMatcher(max_threads=2)
    bitmask = allocate_token_bitmask(21, smollm2_vocab.size)
    batch.batch_fill_next_token_bitmask(matchers[:20], bitmask)

    def cached(row: int) -> bool:
        stacks, can_end, _ = matchers[row].state_key()
        return small.cached_mask(stacks, can_end) is not None

    assert [cached(row) for row in range(20)] == [False] * 4 + [True] * 16
    batch.batch_fill_next_token_bitmask([matchers[4]], bitmask)  # a hit: now the newest
    batch.batch_fill_next_token_bitmask([matchers[20]], bitmask)  # one more out: row 5's
    assert cached(4) and not cached(5) and cached(6) and cached(20)


def test_batch_fill_writes_a_cpu_torch_tensor_in_place(smollm2_vocab) -> None:
    torch = pytest.importorskip(
        "torch", reason="install torch==2.13.0 (the test extras' CPU build)"
    )
    compiled = GrammarCompiler(smollm2_vocab, disk_cache=False).compile_grammar(
        Grammar.from_choices(["yes", "no", "maybe"])
    )
    matchers = [GrammarMatcher(compiled) for _ in range(3)]
    assert matchers[1].accept_string("ma")
    tensor = torch.zeros((3, compiled.words), dtype=torch.int32)
    BatchGrammarMatcher(max_threads=2).batch_fill_next_token_bitmask(matchers, tensor)
    for row, matcher in enumerate(matchers):
        np.testing.assert_array_equal(
            tensor[row].numpy(), matcher.next_token_mask_words().view(np.int32)
        )


def ambiguous_after_y() -> tuple[CompiledGrammar, Vocabulary]:
    """``"y"`` then a grammar whose n "(" make 2^n stacks, compiled with a limit of 50 stacks;
    tokens ``<eos>``, ``x``, ``y`` and ten "(" (ids 0-3)."""
    later = Grammar.from_ebnf(
        'root ::= "y" e\ne ::= "(" e ")" | "(" f ")" | "x"\nf ::= "(" e ")" | "(" f ")" | "x"'
    )
    vocabulary = VOCABULARY.__class__.from_list([b"<eos>", b"x", b"y", b"(" * 10], eos_ids=[0])
    compiled = compile_grammar(later, vocabulary, disk_cache=False, budget=CompileBudget(stacks=50))
    return compiled, vocabulary


def test_an_ambiguous_walk_past_the_stack_limit_is_a_parser_error() -> None:
    # e and f have the same language: after n "(" there are 2^n stacks. The start state is
    # fine; walking the 10-byte token from it needs 1,024 stacks, past the limit of 50. The
    # compile walks the first mask (to refuse a vocabulary that cannot begin), so it fails
    # there; a matcher that reaches such a state later fails the same way in its step.
    grammar = Grammar.from_ebnf(
        'root ::= e\ne ::= "(" e ")" | "(" f ")" | "x"\nf ::= "(" e ")" | "(" f ")" | "x"'
    )
    vocabulary = VOCABULARY.__class__.from_list([b"<eos>", b"x", b"(" * 10], eos_ids=[0])
    with pytest.raises(ParserLimitError, match="more than 50 stacks"):
        compile_grammar(grammar, vocabulary, disk_cache=False, budget=CompileBudget(stacks=50))
    # The same grammar behind one "y": the start is fine, the ambiguous state comes after.
    compiled, vocabulary = ambiguous_after_y()
    matcher = GrammarMatcher(compiled)
    assert matcher.accept_token(2)
    bitmask = allocate_token_bitmask(2, vocabulary.size)
    with pytest.raises(ParserLimitError, match="more than 50 stacks"):
        BatchGrammarMatcher(max_threads=2).batch_fill_next_token_bitmask(
            [GrammarMatcher(compiled), matcher], bitmask
        )
    with pytest.raises(ParserLimitError, match="more than 50 stacks"):
        matcher.allowed_token_ids()


def test_the_memory_cache_is_bounded_in_bytes() -> None:
    # An entry here holds about 4 KB (a lazy automaton makes a few states per mask).
    cache = CompileCache(cache_limit_bytes=10_000, disk_cache=False)
    compiled = [
        cache.compile(Grammar.from_regex(f"x{k}[a-z]{{1,30}}"), VOCABULARY) for k in range(8)
    ]
    for item in compiled:
        GrammarMatcher(item).allowed_token_ids()  # masks grow the entries after they are stored
    cache.compile(Grammar.from_regex("last[0-9]+"), VOCABULARY)
    assert cache.memory_bytes() <= 10_000 + compiled[0].memory_bytes()
    assert cache.compile(Grammar.from_regex("x0[a-z]{1,30}"), VOCABULARY) is not compiled[0]


def test_a_store_measures_a_few_entries_not_every_one() -> None:
    # 400 derived values in a cache that never fills: a full count at every store measured
    # 80,200 sizes (each compile O(entries)); one every entries / 8 stores, a few per store.
    measured = [0]

    def size_of(value: int) -> int:
        measured[0] += 1
        return 100

    cache = CompileCache(cache_limit_bytes=10**9, disk_cache=False)
    for k in range(400):
        assert cache.memoize(("derived", k), lambda k=k: k, size_of) == k
    assert 400 <= measured[0] <= 400 * 10
    assert cache.memory_bytes() == 400 * 100


def test_entries_that_grew_after_storing_are_dropped_within_an_eighth_of_the_stores() -> None:
    sizes: dict[int, int] = {}

    def store(k: int) -> None:
        sizes[k] = 1_000
        cache.memoize(("derived", k), lambda: k, sizes.__getitem__)

    cache = CompileCache(cache_limit_bytes=100_000, disk_cache=False)
    for k in range(64):
        store(k)
    for k in range(64):
        sizes[k] = 4_000  # each grew to 4 KB after it was stored: 256 KB in all
    for k in range(64, 64 + 80 // 8 + 1):
        store(k)
    assert cache.memory_bytes() <= 100_000
    assert cache.memoize(("derived", 0), lambda: -1, lambda _: 0) == -1  # dropped


def test_the_disk_store_evicts_the_least_recently_used(tmp_path) -> None:
    cache = CompileCache(disk_cache=tmp_path, disk_limit_bytes=10**9)
    grammars = [Grammar.from_regex(f"entry{k}[a-z]+") for k in range(5)]
    entries: list[Path] = []
    for k, grammar in enumerate(grammars):
        cache.compile(grammar, VOCABULARY)
        (entry,) = set(tmp_path.glob(f"*{storage.SUFFIX}")) - set(entries)
        entries.append(entry)
        os.utime(entry, (1_000_000 + k, 1_000_000 + k))  # entry 0 the oldest, 4 the newest
    # Read back by another process's cache: a load makes entry 0 the most recently used.
    again = CompileCache(disk_cache=tmp_path).compile(grammars[0], VOCABULARY)
    assert again.compile_statistics.from_cache == "disk"
    storage.evict(tmp_path, entries[0].stat().st_size + entries[4].stat().st_size)
    assert set(tmp_path.glob(f"*{storage.SUFFIX}")) == {entries[0], entries[4]}


def test_serialized_grammars_round_trip_without_pickle() -> None:
    cache = CompileCache(disk_cache=False)
    compiled = cache.compile(Grammar.from_ebnf(ESCAPE_HEAVY), VOCABULARY)
    data = storage.serialize(compiled)
    assert b"pickle" not in data
    again = storage.deserialize(data, VOCABULARY, cache.token_table(VOCABULARY))
    one, other = GrammarMatcher(compiled), GrammarMatcher(again)
    for token_id in greedy_tokenize(VOCABULARY, b"[(ab)]"):
        np.testing.assert_array_equal(one.allowed_token_ids(), other.allowed_token_ids())
        assert one.accept_token(token_id) and other.accept_token(token_id)
    with pytest.raises(storage.StoredGrammarError, match="another vocabulary"):
        other_vocabulary = synthetic_vocabulary().__class__.from_list(
            [b"<eos>", b"a", b"b"], eos_ids=[0]
        )
        storage.deserialize(data, other_vocabulary, cache.token_table(other_vocabulary))


@pytest.mark.parametrize("seed", range(4))
def test_native_token_steps_equal_the_python_parser(seed) -> None:
    # accept_token steps in the kernel; the Python step and closure are the reference, on a
    # grammar where configurations hold several stacks and tokens cross rule ends. The cached
    # step by token id reads the token's bytes from the kernel's table: special and empty
    # tokens have none and are refused, as the Python side did.
    compiled = compile_grammar(Grammar.from_ebnf(ESCAPE_HEAVY), VOCABULARY, disk_cache=False)
    kernel = compiled.kernel
    rng = np.random.default_rng(seed)
    matcher = GrammarMatcher(compiled)
    compared = refused_special = 0
    for _ in range(60):
        stacks = matcher.state_key()[0]
        for token_id in rng.choice(VOCABULARY.size, size=40, replace=False).tolist():
            data = VOCABULARY.token_bytes[token_id]
            step = kernel.step(stacks, token_id)
            assert kernel.step(stacks, token_id) is step  # the cached answer
            if not data or token_id in VOCABULARY.special_ids:
                assert step is None
                refused_special += 1
                continue
            expected = compiled.automaton.advance(stacks, data)
            assert kernel.advance(stacks, data) == expected, (stacks, data)
            assert step == expected, (stacks, token_id)
            compared += 1
        allowed = matcher.allowed_token_ids()
        allowed = allowed[~np.isin(allowed, list(VOCABULARY.eos_ids))]
        if not len(allowed):
            break
        assert matcher.accept_token(int(rng.choice(allowed)))
    assert refused_special > 0
    assert compared > 500


def test_the_step_cache_is_bounded_and_a_limit_is_not_cached() -> None:
    compiled = compile_grammar(Grammar.from_ebnf(ESCAPE_HEAVY), VOCABULARY, disk_cache=False)
    small = NativeMaskKernel(
        compiled.table, compiled.automaton.native, compiled.eos_ids, 1 << 20, 3
    )
    stacks = GrammarMatcher(compiled).state_key()[0]
    for token_id in range(VOCABULARY.size):
        assert small.step(stacks, token_id) == compiled.kernel.step(stacks, token_id)
        assert len(small.steps) <= 3
    assert small.step_cache_entries == 3
    for token_id in (VOCABULARY.size, -1):
        with pytest.raises(IndexError, match="outside the vocabulary"):
            small.step(stacks, token_id)
    # The "((((((((((" token after "y" needs 1,024 stacks, past 50: accept_token raises,
    # keeps its state and caches nothing.
    compiled, _ = ambiguous_after_y()
    matcher = GrammarMatcher(compiled)
    assert matcher.accept_token(2)
    before = matcher.state_key()
    for _ in range(2):
        with pytest.raises(ParserLimitError, match="more than 50 stacks"):
            matcher.accept_token(3)
        assert matcher.state_key() == before
        assert (before[0], 3) not in compiled.kernel.steps


def test_the_step_cache_is_bounded_in_states_too() -> None:
    # Counted in entries alone, a nested grammar's deep configurations held GBs: 65,536
    # steps, each keeping a whole stack (20,000 brackets deep: 6.2 GB).
    dyck = Grammar.from_ebnf('root ::= x\nx ::= "(" x ")" x | ""')
    compiled = compile_grammar(dyck, VOCABULARY, disk_cache=False)
    small = NativeMaskKernel(
        compiled.table, compiled.automaton.native, compiled.eos_ids, 1 << 20, 1 << 16, 40
    )
    stacks = GrammarMatcher(compiled).state_key()[0]
    most = 0
    for _ in range(30):  # deeper at each step: more states in each new configuration
        stepped = small.step(stacks, OPEN)
        assert stepped == compiled.kernel.step(stacks, OPEN)
        stacks = stepped[0]
        most = max(most, small.step_cache_states)
        newest = sum(map(len, stacks))  # kept even alone past the bound
        assert small.step_cache_states <= max(40, newest)
    assert most > 20 and len(small.steps) < 30  # emptied along the way


def test_a_token_table_read_past_its_data_or_vocabulary_is_refused() -> None:
    data = np.frombuffer(b"ab", np.uint8)

    def table(offset: int, length: int, token: int) -> NativeTokenTable:
        ids = np.array([token], np.int32)
        return NativeTokenTable(
            data, np.array([offset], np.int64), np.array([length], np.int32), ids, 10
        )

    with pytest.raises(ValueError, match="outside the data"):  # were segmentation faults
        table(1, 5, 3)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        table(0, 2, 50_000_000)
    assert table(0, 2, 3).vocabulary_size == 10


def test_entries_that_grew_are_dropped_on_reads_too(monkeypatch) -> None:
    # A server with a fixed set of schemas stores nothing new: its grammars' masks grew
    # past the limit and were never measured again (6.9 MB held under a 4 MB limit).
    monkeypatch.setattr(compiler_module, "RECOUNT_SECONDS", 0.0)
    sizes = {0: 1_000, 1: 1_000}
    cache = CompileCache(cache_limit_bytes=10_000, disk_cache=False)
    for k in sizes:
        cache.memoize(("derived", k), lambda k=k: k, sizes.__getitem__)
    sizes[0] = 9_500  # grew after it was stored
    assert cache.memoize(("derived", 1), lambda: -1, sizes.__getitem__) == 1  # a read
    assert cache.memory_bytes() <= 10_000
    assert cache.memoize(("derived", 0), lambda: -1, lambda _: 0) == -1  # dropped


def test_a_vocabularys_token_table_outlives_a_small_limit() -> None:
    # Counted as nothing and kept in the grammars' LRU, the trie was dropped with them and
    # built again at every compile under cache_limit_bytes=0.
    cache = CompileCache(cache_limit_bytes=0, disk_cache=False)
    table = cache.token_table(VOCABULARY)
    for k in range(3):
        cache.compile(Grammar.from_regex(f"t{k}[a-z]+"), VOCABULARY)
    assert cache.token_table(VOCABULARY) is table
