"""The compiled grammar: a pushdown automaton bound to a vocabulary, with lazy token masks.

Compiling builds the grammar's automaton and nothing per state. A state's contribution to a
mask is computed by the native kernel (:mod:`formline.native`) the first time a
configuration reaches it: one depth-first walk of the vocabulary's token trie from that
state, pruned at the first dead byte, gives

* an *inside* mask: the tokens read whole from the state whatever the stack below holds
  (XGrammar's "context-independent" tokens);
* *escape* leftovers: tokens that end the state's rule part-way (a string's closing quote
  followed by ``,`` in ``"abc",``), kept as a trie of the bytes left over once the rule ends.
  Only those depend on the stack below; they are walked against it once per (stack, top).

A configuration's mask is the OR of its stack tops' inside masks plus the escape leftovers the
stacks below accept, cached per configuration (bounded in bytes). For a regex, a choice or a
non-recursive grammar the configuration is one stack, so a mask is one walk, then a lookup.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from formline.automata.native_build import state_limit_error
from formline.mask.bitmask import ids_to_bitmask, words_for
from formline.native import (
    STACK_LIMIT_EXCEEDED,
    STATE_LIMIT_EXCEEDED,
    NativeMaskKernel,
    NativeTokenTable,
)
from formline.parser.pushdown import ParserLimitError, PushdownAutomaton, Stack
from formline.vocab import Vocabulary

# Per compiled grammar: masks of whole configurations, and the kernel's per-state walks.
DEFAULT_MASK_CACHE_BYTES = 64 << 20  # 4,096 masks of Qwen2's 4,748 words
DEFAULT_STATE_CACHE_BYTES = 256 << 20
STEP_CACHE_ENTRIES = 1 << 16  # (configuration, token) steps kept per compiled grammar
# Sets of stack tops whose byte choices are kept (each a tuple of a few bytes): a schema's
# closing searches meet a few hundred; past this many the old ones are dropped at once.
BYTE_CHOICE_ENTRIES = 1 << 14
# Shortest completions kept per compiled grammar (each at most 512 bytes): vLLM's 72
# extraction-dev requests asked 2,145 times from 53 configurations.
COMPLETION_ENTRIES = 1 << 12
# Configurations one shortest-completion search visits at most. "[ab]*a[ab]{22}" has 2^23,
# and its search grew the lazy automaton to its 200,000-state limit (6.5 s and 375 MB under
# a server's model lock) before it failed the request; with this bound it gives up in
# 0.1-0.5 s. Past it the search says "none": no closing. (The extraction-dev searches take
# 0.12 ms p50, 2 ms p90: far fewer.)
COMPLETION_CONFIGURATIONS = 4_096
Step = tuple[frozenset[Stack], bool] | None
_UNKNOWN = object()  # a completion not searched yet (None is an answer: there is none)


def token_table(vocabulary: Vocabulary) -> NativeTokenTable:
    """The vocabulary's usable tokens (not special, not empty) as the kernel's trie.

    Costs O(total token bytes) plus a sort: about 0.1 s for Llama-3's 128k tokens.
    """
    special = vocabulary.special_ids
    ids = [
        token_id
        for token_id, data in enumerate(vocabulary.token_bytes)
        if data and token_id not in special
    ]
    pieces = [vocabulary.token_bytes[token_id] for token_id in ids]
    lengths = np.array([len(piece) for piece in pieces], dtype=np.int32)
    offsets = np.zeros(len(ids), dtype=np.int64)
    if len(ids) > 1:
        np.cumsum(lengths[:-1], out=offsets[1:])
    data = np.frombuffer(b"".join(pieces), dtype=np.uint8)
    return NativeTokenTable(data, offsets, lengths, np.array(ids, dtype=np.int32), vocabulary.size)


@dataclass
class CompileStatistics:
    seconds: float = 0.0
    states: int = 0  # DFA states made so far (the automaton is made lazily)
    unique_masks: int = 0  # so far: masks are computed lazily
    escape_groups: int = 0  # escape leftover entries so far
    states_walked: int = 0
    closed_states: int = 0  # states whose walks take whole subtrees of the trie at once
    piece_transitions: int = 0  # byte transitions in the tables of the pieces kept
    alike_walks: int = 0  # walks that took their short tokens from an alike state
    bounded_walks: int = 0  # walks that took their short tokens from a bounded piece
    from_cache: str = "none"  # "none", "memory" or "disk"


class LiveBytes:
    """``live_bytes[state]``: the bytes with a transition from ``state`` (computed on demand,
    the state's row made first when the automaton has not made it yet)."""

    def __init__(self, automaton: PushdownAutomaton):
        self._automaton = automaton
        self._known: dict[int, tuple[int, ...]] = {}

    def __getitem__(self, state: int) -> tuple[int, ...]:
        known = self._known.get(state)
        if known is None:
            row = np.frombuffer(self._automaton.row(state), dtype=np.int32)
            known = tuple(np.nonzero(row >= 0)[0].tolist())
            self._known[state] = known
        return known


class ByteChoices:
    """``byte_choices[tops]``: the bytes worth trying next from a configuration whose stack
    tops are the states ``tops``. Two bytes that move every state of ``tops`` to the same
    states lead to the same configuration (a step reads only the tops' rows:
    :meth:`PushdownAutomaton.step`), so of each such group of live bytes only the smallest is
    kept, in ascending order: a search that tries these in order finds what it would find
    trying every live byte. Inside a JSON string value 147 live bytes are 10 choices
    (SmolLM2, extraction-dev's person schema), and the closing search's 40 µs a row a step
    (vLLM's extraction-dev run, replayed) came from trying each.
    Computed once per set of tops (one numpy pass over their rows), at most
    :data:`BYTE_CHOICE_ENTRIES` kept."""

    def __init__(self, automaton: PushdownAutomaton):
        self._automaton = automaton
        self._known: dict[frozenset[int], tuple[int, ...]] = {}

    def __getitem__(self, tops: frozenset[int]) -> tuple[int, ...]:
        known = self._known.get(tops)
        if known is None:
            if not tops:
                return ()
            rows = np.stack(
                [np.frombuffer(self._automaton.row(top), dtype=np.int32) for top in tops]
            )
            live = np.flatnonzero((rows >= 0).any(axis=0))
            # The first of each distinct column is its group's smallest byte (live ascends).
            _, first = np.unique(rows[:, live], axis=1, return_index=True)
            known = tuple(sorted(live[first].tolist()))
            if len(self._known) >= BYTE_CHOICE_ENTRIES:
                self._known.clear()
            self._known[tops] = known
        return known


@lru_cache(maxsize=64)
def stop_tokens(eos_ids: tuple[int, ...], words: int) -> tuple[np.ndarray, np.ndarray]:
    """A vocabulary's stop tokens as read-only int32 ids and their mask words, made once per
    vocabulary (each compile built them: 20 µs of a median MaskBench schema's 840 µs, in a
    compile's cold caches). Raises IndexError for an id past ``words * 32``."""
    ids = np.array(eos_ids, dtype=np.int32)
    mask = ids_to_bitmask(ids, words)
    ids.setflags(write=False)
    mask.setflags(write=False)
    return ids, mask


@dataclass
class CompiledGrammar:
    """A grammar bound to one vocabulary: automaton, native mask kernel and a mask cache.

    Cheap to build (see :class:`formline.mask.GrammarCompiler`: the automaton only), cheap to
    share: matchers for many sequences use one compiled grammar. Thread-safe.
    """

    automaton: PushdownAutomaton
    vocabulary: Vocabulary
    table: NativeTokenTable
    key: str
    compile_statistics: CompileStatistics = field(default_factory=CompileStatistics)
    mask_cache_bytes: int = DEFAULT_MASK_CACHE_BYTES
    state_cache_bytes: int = DEFAULT_STATE_CACHE_BYTES

    def __post_init__(self) -> None:
        automaton = self.automaton
        self.words = words_for(self.vocabulary.size)
        self.eos_ids, self.eos_mask = stop_tokens(
            tuple(sorted(self.vocabulary.eos_ids)), self.words
        )
        self.kernel = NativeMaskKernel(
            self.table, automaton.native, self.eos_ids, self.state_cache_bytes, STEP_CACHE_ENTRIES
        )
        self.live_bytes = LiveBytes(automaton)
        self.byte_choices = ByteChoices(automaton)
        self._mask_cache: OrderedDict[tuple[frozenset[Stack], bool], np.ndarray] = OrderedDict()
        self._mask_cache_entries = max(16, self.mask_cache_bytes // (4 * self.words))
        self._lock = threading.Lock()
        self._completions: dict[tuple[frozenset[Stack], int], bytes | None] = {}

    def advance(self, stacks: frozenset[Stack], token_id: int) -> Step:
        """The closed configuration and ``can_end`` after reading token ``token_id`` (not a
        stop token) from ``stacks``, or ``None`` if the grammar refuses it. Cached per
        (configuration, token) in the kernel, at most :data:`STEP_CACHE_ENTRIES`: decoding
        meets the same configurations again (inside a string every character leaves it
        where it was).

        Raises:
            ParserLimitError: the step needs more stacks than the automaton's limit.
            AutomatonLimitError: it needs more DFA states than the automaton's limit.
            IndexError: ``token_id`` is outside the vocabulary.
        Costs a dictionary lookup when cached, else the kernel's step, GIL released when
        long: O(token bytes x stacks), about 1 µs (bench/results/maskbench.md).
        """
        result = self.kernel.step(stacks, token_id)
        if isinstance(result, int):
            self.check_status(result)
            return None
        return result

    def advance_bytes(self, stacks: frozenset[Stack], data: bytes) -> Step:
        """The closed configuration and ``can_end`` after reading ``data`` (non-empty) from
        ``stacks`` in the kernel, or ``None`` if the grammar refuses it (uncached: decoding's
        text steps, the jump-forward and closing searches).

        Raises:
            ParserLimitError: the step needs more stacks than the automaton's limit.
            AutomatonLimitError: it needs more DFA states than the automaton's limit.
        Costs O(len(data) x stacks), GIL released when long.
        """
        stepped = self.kernel.advance(stacks, data)
        if isinstance(stepped, int):
            self.check_status(stepped)
            return None
        return stepped

    def shortest_completion(self, stacks: frozenset[Stack], max_bytes: int = 512) -> bytes | None:
        """The shortest non-empty byte string after which the grammar can end, read from the
        closed configuration ``stacks`` (``None`` when there is none within ``max_bytes``,
        or none found within :data:`COMPLETION_CONFIGURATIONS` configurations).
        Breadth-first over configurations, each visited once, trying the bytes
        :attr:`byte_choices` keeps (the smallest first, so ties go to the smallest bytes).

        Raises:
            AutomatonLimitError: as :meth:`advance_bytes` (a branch past the stack limit
                is left, not raised: another may end).
        Costs a lookup for a configuration asked before (at most :data:`COMPLETION_ENTRIES`
        kept: the closing policy asks at every step near a budget's end, and decoding comes
        back to the same configurations), else O(configurations x byte choices): 0.12 ms
        p50, 2.0 ms p90 at every seventh byte of the extraction-dev gold answers (SmolLM2)."""
        if self.automaton.native.failed:  # as advance_bytes would say, remembered or not
            raise state_limit_error(self.automaton.native.capacity)
        key = (stacks, max_bytes)
        # One lookup: a membership test then an index could meet another thread's clear().
        known = self._completions.get(key, _UNKNOWN)
        if known is not _UNKNOWN:
            return known  # type: ignore[return-value]
        completion = self._search_completion(stacks, max_bytes)
        if len(self._completions) >= COMPLETION_ENTRIES:
            self._completions.clear()
        self._completions[key] = completion
        return completion

    def _search_completion(self, stacks: frozenset[Stack], max_bytes: int) -> bytes | None:
        choices = self.byte_choices
        frontier: list[tuple[frozenset[Stack], bytes]] = [(stacks, b"")]
        seen = {stacks}
        while frontier:
            next_frontier: list[tuple[frozenset[Stack], bytes]] = []
            for current, text in frontier:
                for byte in choices[frozenset([stack[-1] for stack in current])]:
                    try:
                        result = self.advance_bytes(current, bytes((byte,)))
                    except ParserLimitError:
                        # That branch alone is too ambiguous: another may still end (the
                        # error failed the request, or closed a vLLM row, inside the
                        # closing window though the text so far was fine).
                        continue
                    if result is None or result[0] in seen:
                        continue
                    if result[1]:
                        return text + bytes((byte,))
                    seen.add(result[0])
                    if len(seen) > COMPLETION_CONFIGURATIONS:
                        return None
                    if len(text) + 1 < max_bytes:
                        next_frontier.append((result[0], text + bytes((byte,))))
            frontier = next_frontier
        return None

    @property
    def vocabulary_size(self) -> int:
        return self.vocabulary.size

    @property
    def statistics(self) -> CompileStatistics:
        """Compile figures, with the lazy walks done so far."""
        walked = self.kernel.statistics()
        stats = self.compile_statistics
        stats.states = self.automaton.size  # the lazy automaton grows as decoding goes
        stats.unique_masks = walked["unique_masks"]
        stats.escape_groups = walked["escape_entries"]
        stats.states_walked = walked["states_walked"]
        stats.closed_states = walked["closed_states"]
        stats.piece_transitions = walked["piece_transitions"]
        stats.alike_walks = walked["alike_walks"]
        stats.bounded_walks = walked["bounded_walks"]
        return stats

    def memory_bytes(self) -> int:
        """Bytes held: the automaton's tables, the kernel's walks and the mask cache."""
        with self._lock:
            cached = len(self._mask_cache) * 4 * self.words
        return self.automaton.memory_bytes() + cached + self.kernel.statistics()["memory_bytes"]

    def mask_words(self, stacks: frozenset[Stack], can_end: bool) -> np.ndarray:
        """The uint32 bitmask words for a configuration (cached; read-only).

        Raises:
            ParserLimitError: a walk needed more stacks than the automaton's limit.
        Costs a dictionary lookup when cached; otherwise the OR of the stack tops' masks
        (each top's first use walks the token trie once, GIL released, about 1-5 ms for a
        JSON string state on 128k tokens) plus the escape checks against the stacks below.
        """
        cached = self.cached_mask(stacks, can_end)
        if cached is not None:
            return cached
        words = self.compute_mask(stacks, can_end)
        self.remember_mask(stacks, can_end, words)
        return words

    def remember_mask(self, stacks: frozenset[Stack], can_end: bool, words: np.ndarray) -> None:
        """Cache ``words`` (made read-only here) as the configuration's mask; the oldest entry
        goes when the cache is over its bytes."""
        self.remember_masks(((stacks, can_end, words),))

    def remember_masks(self, entries: Sequence[tuple[frozenset[Stack], bool, np.ndarray]]) -> None:
        """:meth:`remember_mask` for each ``(stacks, can_end, words)``, under one lock (a batch's
        30 new configurations: 18 µs one by one)."""
        for _, _, words in entries:
            words.setflags(write=False)
        with self._lock:
            cache = self._mask_cache
            for stacks, can_end, words in entries:
                cache[(stacks, can_end)] = words
            while len(cache) > self._mask_cache_entries:
                cache.popitem(last=False)

    def look_up_masks(
        self, states: Sequence[tuple[frozenset[Stack], bool, bool]]
    ) -> tuple[list[np.ndarray | None], dict[tuple[frozenset[Stack], bool], list[int]]]:
        """For each matcher state ``(stacks, can_end, terminated)``: its cached mask (a
        terminated one: the stop-token mask) or ``None``; and the configurations not cached,
        in first-seen order, each with the positions of its states. One lock for all of
        ``states`` (64 rows: 25 µs one by one, 6 µs so), and one pass: grouping the rows
        not cached was a second one (19 µs of a 64-row cold fill, fifteenth pass's timer)."""
        found: list[np.ndarray | None] = []
        missing: dict[tuple[frozenset[Stack], bool], list[int]] = {}
        eos_mask = self.eos_mask
        with self._lock:
            cache = self._mask_cache
            get, touch = cache.get, cache.move_to_end
            for position, (stacks, can_end, terminated) in enumerate(states):
                if terminated:
                    found.append(eos_mask)
                    continue
                key = (stacks, can_end)
                words = get(key)
                if words is None:
                    positions = missing.get(key)
                    if positions is None:
                        missing[key] = [position]
                    else:
                        positions.append(position)
                else:
                    touch(key)
                found.append(words)
        return found, missing

    def cached_mask(self, stacks: frozenset[Stack], can_end: bool) -> np.ndarray | None:
        """The configuration's mask if it is cached, else ``None`` (nothing is computed)."""
        key = (stacks, can_end)
        with self._lock:
            cached = self._mask_cache.get(key)
            if cached is not None:
                self._mask_cache.move_to_end(key)
            return cached

    def compute_mask(self, stacks: frozenset[Stack], can_end: bool) -> np.ndarray:
        """The mask of a configuration, uncached (see :meth:`mask_words`)."""
        words = np.empty(self.words, dtype=np.uint32)
        self.check_status(self.kernel.fill(stacks, can_end, words))
        return words

    def check_status(self, status: int) -> None:
        """Raise for a kernel's error status (0 and positive statuses pass).

        Raises:
            ParserLimitError: ``status`` is the kernel's stack-limit answer.
            AutomatonLimitError: the automaton needed more DFA states than its limit.
        """
        if status == STACK_LIMIT_EXCEEDED:
            raise ParserLimitError(
                f"a token walk needs more than {self.automaton.stack_limit} stacks: "
                "the grammar is too ambiguous"
            )
        if status == STATE_LIMIT_EXCEEDED:
            raise state_limit_error(self.automaton.native.capacity)

    def clear_mask_cache(self) -> None:
        """Forget the configuration masks (the kernel's per-state walks stay)."""
        with self._lock:
            self._mask_cache.clear()

    def statistics_text(self) -> str:
        stats = self.statistics
        return (
            f"{stats.states} states made so far, compiled in {stats.seconds * 1000:.1f} ms "
            f"(cache: {stats.from_cache}); masks so far: {stats.states_walked} states walked, "
            f"{stats.unique_masks} unique, {stats.escape_groups} escape leftovers"
        )
