"""The batch fill's kept helper threads (``native/pool.hpp``): masks equal one matcher at a
time whether the pool is free, busy with another thread's batch, prepared and never used, or
inherited by a forked child that has none of its threads; and when two threads search the
same cold string pieces at once (``native/kernel.hpp``'s ``check_piece``)."""

from __future__ import annotations

import multiprocessing
import os
import threading
from typing import Any

import numpy as np
import pytest

from formline import GrammarCompiler
from formline.grammar import Grammar
from formline.mask import BatchGrammarMatcher, GrammarMatcher, allocate_token_bitmask
from formline.mask.compiler import compile_grammar
from formline.native import helper_threads, prepare_helpers, release_helpers, spin_mutex_count
from formline.vocab import Vocabulary

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "age": {"type": "integer", "minimum": 0},
        "city": {"type": "string", "maxLength": 12},
    },
    "required": ["name", "city", "age", "tags"],
}
INSTANCE = '{"name":"Ada Lovelace","tags":["math","poetry"],"age":36,"city":"London"}'


def rows_of_a_fresh_compile(vocabulary: Any, count: int = 32) -> list[Any]:
    """``count`` matchers along the instance (a new compile: every state walks again)."""
    compiled = GrammarCompiler(vocabulary, disk_cache=False).compile_json_schema(SCHEMA)
    matchers = []
    for row in range(count):
        matcher = compiled.matcher()
        assert matcher.accept_string(INSTANCE[: row * len(INSTANCE) // count])
        matchers.append(matcher)
    return matchers


def single_fills(vocabulary: Any, count: int = 32) -> np.ndarray:
    """Each row's mask from a matcher of its own compile, filled alone."""
    expected = allocate_token_bitmask(count, vocabulary.size)
    for row, matcher in enumerate(rows_of_a_fresh_compile(vocabulary, count)):
        matcher.fill_next_token_bitmask(expected, row)
    return expected


def batch_fill(vocabulary: Any, threads: int, count: int = 32) -> np.ndarray:
    bitmask = allocate_token_bitmask(count, vocabulary.size)
    matchers = rows_of_a_fresh_compile(vocabulary, count)
    BatchGrammarMatcher(max_threads=threads).batch_fill_next_token_bitmask(matchers, bitmask)
    return bitmask


def test_batches_from_two_threads_at_once_equal_single_fills(smollm2_vocab: Any) -> None:
    # One batch holds the pool; the other, finding it busy, runs on threads of its own.
    expected = single_fills(smollm2_vocab)
    results: list[np.ndarray] = []
    errors: list[BaseException] = []

    def fill_many() -> None:
        try:
            for _ in range(6):
                results.append(batch_fill(smollm2_vocab, threads=2))
        except BaseException as error:  # reported below, not lost in the thread
            errors.append(error)

    workers = [threading.Thread(target=fill_many) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert not errors, errors
    assert len(results) == 12
    for result in results:
        np.testing.assert_array_equal(result, expected)


def usable_cpus() -> int:
    return len(os.sched_getaffinity(0))


def test_prepared_helpers_that_get_no_work_park_and_come_back(smollm2_vocab: Any) -> None:
    # Helpers woken and never handed work must not keep the next fill from finishing or from
    # using them; the fill runs in a thread so that a hang fails here instead of stalling.
    expected = single_fills(smollm2_vocab)
    prepare_helpers(2)  # woken, then released without a job
    release_helpers(2)
    prepare_helpers(2)  # woken and left to give up spinning on their own (2 ms)
    threading.Event().wait(0.01)
    filled: list[np.ndarray] = []
    worker = threading.Thread(target=lambda: filled.append(batch_fill(smollm2_vocab, 2)))
    worker.start()
    worker.join(timeout=60)
    release_helpers(2)
    assert filled, "a 2-thread fill after unused helpers did not finish in 60 s"
    np.testing.assert_array_equal(filled[0], expected)
    prepare_helpers(1)  # one thread: nothing to wake, nothing to release
    release_helpers(1)


def test_helpers_are_at_most_one_fewer_than_the_cpus(smollm2_vocab: Any) -> None:
    expected = single_fills(smollm2_vocab)
    np.testing.assert_array_equal(batch_fill(smollm2_vocab, threads=usable_cpus() + 3), expected)
    assert helper_threads() == usable_cpus() - 1


def _fill_in_child(vocabulary: Any, queue: Any) -> None:
    before = helper_threads()
    filled = batch_fill(vocabulary, threads=2).tobytes()
    queue.put((before, helper_threads(), filled))


def test_a_forked_child_fills_with_threads_of_its_own(smollm2_vocab: Any) -> None:
    # The parent's pool has threads; the forked child has none of them and must make its own
    # pool (one that counted the parent's helpers would hand work to threads that are not
    # there, and a lock held by one of them at the fork would never be released).
    expected = single_fills(smollm2_vocab)
    np.testing.assert_array_equal(batch_fill(smollm2_vocab, threads=2), expected)
    helpers = min(1, usable_cpus() - 1)
    assert helper_threads() >= helpers
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_fill_in_child, args=(smollm2_vocab, queue))
    child.start()
    before, after, filled = queue.get(timeout=120)
    child.join(timeout=30)
    assert child.exitcode == 0
    assert (before, after) == (0, helpers)
    np.testing.assert_array_equal(
        np.frombuffer(filled, dtype=np.int32).reshape(expected.shape), expected
    )


FIELDS = ("name", "email", "city", "notes", "title", "bio")
PIECES_SCHEMA = {
    "type": "object",
    "properties": {field: {"type": "string"} for field in FIELDS},
    "required": list(FIELDS),
    "additionalProperties": False,
}


def string_prefixes() -> list[str]:
    """Prefixes that stop inside each field's string: after its opening quote and after two
    characters (each field's content state starts a piece of its own)."""
    prefixes, text = [], "{"
    for position, field in enumerate(FIELDS):
        text += ("," if position else "") + f'"{field}":"'
        prefixes += [text, text + field[:2]]
        text += field + '"'
    return prefixes


def cold_rows(vocabulary: Any) -> tuple[Any, list[Any]]:
    compiled = GrammarCompiler(vocabulary, disk_cache=False).compile_json_schema(PIECES_SCHEMA)
    matchers = []
    for prefix in string_prefixes():
        matcher = compiled.matcher()
        assert matcher.accept_string(prefix)
        matchers.append(matcher)
    return compiled, matchers


def test_pieces_searched_on_two_threads_at_once_equal_single_fills(smollm2_vocab: Any) -> None:
    # A cold 2-thread fill searches the six string pieces on both threads at once, outside
    # the lock that publishes them (kernel.hpp's check_piece); the masks and the count of
    # states that take subtrees whole must be those of one thread.
    compiled, matchers = cold_rows(smollm2_vocab)
    expected = allocate_token_bitmask(len(matchers), smollm2_vocab.size)
    for row, matcher in enumerate(matchers):
        matcher.fill_next_token_bitmask(expected, row)
    closed = compiled.compiled_grammar.statistics.closed_states
    assert closed >= len(FIELDS)
    for _ in range(8):
        compiled, matchers = cold_rows(smollm2_vocab)
        bitmask = allocate_token_bitmask(len(matchers), smollm2_vocab.size)
        BatchGrammarMatcher(max_threads=2).batch_fill_next_token_bitmask(matchers, bitmask)
        np.testing.assert_array_equal(bitmask, expected)
        assert compiled.compiled_grammar.statistics.closed_states == closed


def test_threads_that_search_one_piece_at_once_agree(smollm2_vocab: Any) -> None:
    # Two Python threads fill the same cold state of one grammar at once (the kernel runs
    # without the GIL): both may search its piece; the one published first is kept.
    compiled, matchers = cold_rows(smollm2_vocab)
    expected = allocate_token_bitmask(1, smollm2_vocab.size)
    matchers[0].fill_next_token_bitmask(expected)
    closed = compiled.compiled_grammar.statistics.closed_states
    for _ in range(8):
        compiled, matchers = cold_rows(smollm2_vocab)
        pair = [matchers[0], compiled.matcher()]
        assert pair[1].accept_string(string_prefixes()[0])
        bitmasks = [allocate_token_bitmask(1, smollm2_vocab.size) for _ in pair]
        fill_at_once(pair, bitmasks)
        for bitmask in bitmasks:
            np.testing.assert_array_equal(bitmask, expected)
        assert compiled.compiled_grammar.statistics.closed_states == closed


def fill_at_once(matchers: list[Any], bitmasks: list[np.ndarray]) -> None:
    """Each matcher fills its bitmask on a thread of its own, all starting together."""
    start = threading.Barrier(len(matchers))

    def fill(index: int) -> None:
        start.wait()
        matchers[index].fill_next_token_bitmask(bitmasks[index])

    workers = [threading.Thread(target=fill, args=(index,)) for index in range(len(matchers))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)


def test_spin_mutex_excludes_when_it_spins_and_when_it_sleeps() -> None:
    """The batch's locks (``native/spin_mutex.hpp``) spin before they sleep: two threads add
    to a plain counter under one, and no addition is lost, whether the waiter gets the lock
    while spinning (short sections) or gives up and sleeps (a section held 200 µs, past the
    50 µs spin, every 50th round)."""
    assert spin_mutex_count(2, 200_000) == 400_000
    assert spin_mutex_count(3, 2_000, hold_every=50, hold_microseconds=200) == 6_000


def test_numpy_row_numbers_pass_and_bad_indices_or_shapes_are_refused() -> None:
    vocabulary = Vocabulary.from_list([b"<eos>", b"a", b"b"], eos_ids=[0])
    matcher = GrammarMatcher(
        compile_grammar(Grammar.from_regex("ab"), vocabulary, disk_cache=False)
    )
    bitmask = allocate_token_bitmask(2, vocabulary.size)
    assert matcher.fill_next_token_bitmask(bitmask, np.int64(1))  # a numpy row number
    assert bitmask[1, 0] == 1 << 1 and bitmask[0, 0] == -1
    batch = BatchGrammarMatcher(max_threads=1)
    with pytest.raises(ValueError, match="indices must be integers"):
        batch.batch_fill_next_token_bitmask([matcher], bitmask, [1.7])  # it was row 1
    with pytest.raises(ValueError, match="1 or 2 dimensions"):
        batch.batch_fill_next_token_bitmask([matcher], np.zeros((1, 1, 1), dtype=np.int32))
    import torch  # a test dependency (.ci/run installs it); the mask core does not import it

    with pytest.raises(ValueError, match="must be int32"):  # met after the fill's work
        batch.batch_fill_next_token_bitmask([matcher], torch.zeros(1, 1, dtype=torch.int64))
