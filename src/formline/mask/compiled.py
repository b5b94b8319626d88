"""The compiled grammar: a grammar bound to a vocabulary, with per-state token masks.

For every automaton state that can read a byte, compilation stores:

* an *inside* mask: the tokens whose bytes the state's DFA reads whole. They are allowed
  whatever the parser stack below holds (XGrammar's "context-independent" tokens);
* *escape groups*: tokens that leave the current rule part-way (a string's closing quote
  followed by ``,`` in ``"abc",``), grouped by the bytes left over once the rule has ended.
  Only those leftovers depend on the stack below; they are indexed by first byte, so a mask
  miss walks only the leftovers that start with a byte the stack below can read (on the
  recursive JSON benchmark grammar a cold mask on Qwen2 costs at most 165 µs,
  ``python -m bench.core_bench``).

At decode time a mask is the OR of the inside masks of the configuration's stack tops plus the
escape groups whose leftover the stack below accepts, and it is cached per configuration.
For a regex, a choice or a non-recursive grammar the configuration is one stack and the mask
is one precomputed array: no walk at all.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from formline.automata.dfa import refine_partition
from formline.mask.bitmask import ids_to_bitmask, words_for
from formline.mask.token_index import (
    ACCEPTING,
    CALLING,
    SHORT_TOKEN_BYTES,
    TokenIndex,
    WalkResult,
)
from formline.parser.pushdown import BASE, PushdownAutomaton, Stack
from formline.vocab import Vocabulary

DEFAULT_MASK_CACHE_ENTRIES = 4096
ESCAPE_CACHE_ENTRIES = 65_536


@dataclass
class StateMasks:
    """Precomputed per-state data (picklable: this is what the disk cache stores)."""

    inside_index: np.ndarray  # int32 (states,): row of ``inside_masks``, -1 if none
    inside_masks: np.ndarray  # uint32 (unique masks, words)
    # per state: first leftover byte -> [(leftover bytes, token ids)]; indexed by first byte
    # so a mask miss only walks the leftovers whose first byte the stack below can read.
    escapes: list[dict[int, list[tuple[bytes, np.ndarray]]]]
    live_bytes: list[tuple[int, ...]]  # per state: bytes with a transition


def _classify_candidates(
    automaton: PushdownAutomaton, vocabulary: Vocabulary, state: int, candidates: np.ndarray
) -> tuple[list[int], dict[bytes, list[int]]]:
    """Walk candidate tokens through the full parser from ``state`` on an unknown stack."""
    inside: list[int] = []
    escapes: dict[bytes, list[int]] = {}
    start: frozenset[Stack] = frozenset({(BASE, state)})
    token_bytes = vocabulary.token_bytes
    for token_id in candidates.tolist():
        data = token_bytes[token_id]
        current = start
        last = len(data) - 1
        for index, byte in enumerate(data):
            raw = automaton.step(current, byte)
            if not raw:
                break
            if index == last:
                inside.append(token_id)
                break
            current, _, escaped = automaton.closure(raw)
            if escaped:
                escapes.setdefault(data[index + 1 :], []).append(token_id)
    return inside, escapes


def precompute_state_masks(
    automaton: PushdownAutomaton, index: TokenIndex, vocabulary: Vocabulary
) -> StateMasks:
    """Compute every state's inside mask and escape groups.

    States that agree on every path of up to 16 bytes (the counter states of ``[a-z]{1,40}``,
    say) share one vectorised walk of the short tokens; each state walks the few long tokens
    itself. Candidate tokens (crossing a rule boundary) take a Python parser walk per state.
    Costs O(bytes of the tokens each class of states can start) plus the candidate walks.
    """
    flat = automaton.transitions.reshape(-1)
    kinds = automaton.accepting.astype(np.int64) * ACCEPTING + np.array(
        [CALLING if calls else 0 for calls in automaton.calls], dtype=np.int64
    )
    classes = refine_partition(automaton.transitions, kinds, SHORT_TOKEN_BYTES)
    short_walks: dict[int, WalkResult] = {}
    builder = _MaskBuilder(automaton, vocabulary)
    for state in range(automaton.size):
        if not automaton.has_bytes[state]:
            builder.add_empty()
            continue
        short = short_walks.get(int(classes[state]))
        if short is None:
            short = short_walks[int(classes[state])] = index.walk(flat, kinds, state, "short")
        long = index.walk(flat, kinds, state, "long")
        builder.add(
            state,
            np.concatenate([short.inside, long.inside]),
            np.concatenate([short.candidates, long.candidates]),
            np.concatenate([short.escape_ids, long.escape_ids]),
            np.concatenate([short.escape_offsets, long.escape_offsets]),
        )
    return builder.finish()


class _MaskBuilder:
    """Collects per-state masks (deduplicated) and escape groups."""

    def __init__(self, automaton: PushdownAutomaton, vocabulary: Vocabulary):
        self.automaton = automaton
        self.vocabulary = vocabulary
        self.words = words_for(vocabulary.size)
        self.unique: dict[bytes, int] = {}
        self.masks: list[np.ndarray] = []
        self.inside_index: list[int] = []
        self.escapes: list[dict[int, list[tuple[bytes, np.ndarray]]]] = []
        # Stacks whose top is in an uncalled start rule have nothing below them: their escape
        # groups could never apply, and without any call edge no candidate is read whole.
        self.start_is_called = any(
            callee == automaton.start for calls in automaton.calls for callee, _ in calls
        )
        self.has_calls = any(automaton.calls)

    def add_empty(self) -> None:
        self.inside_index.append(-1)
        self.escapes.append({})

    def add(
        self,
        state: int,
        inside: np.ndarray,
        candidates: np.ndarray,
        escape_ids: np.ndarray,
        escape_offsets: np.ndarray,
    ) -> None:
        in_start_rule = self.automaton.rule_of_state[state] == 0 and not self.start_is_called
        groups: dict[bytes, list[int]] = {}
        if len(candidates) and not (in_start_rule and not self.has_calls):
            extra, groups = _classify_candidates(self.automaton, self.vocabulary, state, candidates)
            if extra:
                inside = np.concatenate([inside, np.array(extra, dtype=np.int32)])
        if not in_start_rule:
            token_bytes = self.vocabulary.token_bytes
            for token_id, offset in zip(escape_ids.tolist(), escape_offsets.tolist(), strict=True):
                groups.setdefault(token_bytes[token_id][offset:], []).append(token_id)
        else:
            groups = {}
        mask = ids_to_bitmask(inside, self.words)
        key = mask.tobytes()
        if key not in self.unique:
            self.unique[key] = len(self.masks)
            self.masks.append(mask)
        self.inside_index.append(self.unique[key])
        by_first_byte: dict[int, list[tuple[bytes, np.ndarray]]] = {}
        for leftover, ids in groups.items():
            by_first_byte.setdefault(leftover[0], []).append(
                (leftover, np.array(ids, dtype=np.int32))
            )
        self.escapes.append(by_first_byte)

    def finish(self) -> StateMasks:
        automaton = self.automaton
        live_bytes = [tuple(np.nonzero(row >= 0)[0].tolist()) for row in automaton.transitions]
        stacked = np.stack(self.masks) if self.masks else np.zeros((0, self.words), dtype=np.uint32)
        inside_index = np.array(self.inside_index, dtype=np.int32)
        return StateMasks(inside_index, stacked, self.escapes, live_bytes)


@dataclass
class CompileStatistics:
    seconds: float = 0.0
    states: int = 0
    unique_masks: int = 0
    escape_groups: int = 0
    from_cache: str = "none"  # "none", "memory" or "disk"


@dataclass
class CompiledGrammar:
    """A grammar bound to one vocabulary: automaton, per-state masks and a mask cache.

    Expensive to build (see :func:`formline.mask.compile_grammar`), cheap to share: matchers
    for many sequences use one compiled grammar. Thread-safe for reading.
    """

    automaton: PushdownAutomaton
    vocabulary: Vocabulary
    state_masks: StateMasks
    key: str
    statistics: CompileStatistics = field(default_factory=CompileStatistics)
    mask_cache_entries: int = DEFAULT_MASK_CACHE_ENTRIES

    def __post_init__(self) -> None:
        self.words = words_for(self.vocabulary.size)
        self.eos_ids = np.array(sorted(self.vocabulary.eos_ids), dtype=np.int32)
        self.eos_mask = ids_to_bitmask(self.eos_ids, self.words)
        self._mask_cache: OrderedDict[tuple[frozenset[Stack], bool], np.ndarray] = OrderedDict()
        self._escape_cache: dict[tuple[Stack, int], np.ndarray] = {}

    @property
    def vocabulary_size(self) -> int:
        return self.vocabulary.size

    def mask_words(self, stacks: frozenset[Stack], can_end: bool) -> np.ndarray:
        """The uint32 bitmask words for a configuration (cached; do not modify the result).

        Costs a dictionary lookup when cached; otherwise O(stacks x words) plus the leftover
        checks of the escape groups of the stack tops.
        """
        key = (stacks, can_end)
        cached = self._mask_cache.get(key)
        if cached is not None:
            self._mask_cache.move_to_end(key)
            return cached
        words = self._compute(stacks, can_end)
        words.setflags(write=False)
        self._mask_cache[key] = words
        if len(self._mask_cache) > self.mask_cache_entries:
            self._mask_cache.popitem(last=False)
        return words

    def _compute(self, stacks: frozenset[Stack], can_end: bool) -> np.ndarray:
        masks = self.state_masks
        words = np.zeros(self.words, dtype=np.uint32)
        for stack in stacks:
            top = stack[-1]
            row = masks.inside_index[top]
            if row >= 0:
                words |= masks.inside_masks[row]
            if len(stack) > 1 and masks.escapes[top]:
                self._add_escapes(words, stack, masks.escapes[top])
        if can_end:
            words |= self.eos_mask
        return words

    def _add_escapes(
        self, words: np.ndarray, stack: Stack, groups: dict[int, list[tuple[bytes, np.ndarray]]]
    ) -> None:
        below = stack[:-1]
        key = (below, stack[-1])
        token_ids = self._escape_cache.get(key)
        if token_ids is None:
            token_ids = self._allowed_escapes(below, groups)
            if len(self._escape_cache) < ESCAPE_CACHE_ENTRIES:
                self._escape_cache[key] = token_ids
        if len(token_ids):
            np.bitwise_or.at(
                words, token_ids >> 5, np.left_shift(1, token_ids & 31).astype(np.uint32)
            )

    def _allowed_escapes(
        self, below: Stack, groups: dict[int, list[tuple[bytes, np.ndarray]]]
    ) -> np.ndarray:
        """Token ids of the groups whose leftover bytes the stack ``below`` reads."""
        automaton = self.automaton
        closed = automaton.closure([below])[0]
        live_bytes = self.state_masks.live_bytes
        # Most leftovers fail on their first byte: only those starting with a byte the stack
        # below can read are walked.
        first_bytes = {byte for stack in closed for byte in live_bytes[stack[-1]]}
        allowed = [
            token_ids
            for byte in first_bytes.intersection(groups)
            for leftover, token_ids in groups[byte]
            if automaton.accepts_after(closed, leftover)
        ]
        return np.concatenate(allowed) if allowed else np.zeros(0, dtype=np.int32)

    def statistics_text(self) -> str:
        stats = self.statistics
        return (
            f"{stats.states} states, {stats.unique_masks} unique masks, "
            f"{stats.escape_groups} escape groups, compiled in {stats.seconds * 1000:.1f} ms "
            f"(cache: {stats.from_cache})"
        )


def build_compiled(
    automaton: PushdownAutomaton, vocabulary: Vocabulary, index: TokenIndex, key: str
) -> CompiledGrammar:
    started = time.perf_counter()
    state_masks = precompute_state_masks(automaton, index, vocabulary)
    compiled = CompiledGrammar(automaton, vocabulary, state_masks, key)
    compiled.statistics = CompileStatistics(
        seconds=time.perf_counter() - started,
        states=automaton.size,
        unique_masks=len(state_masks.inside_masks),
        escape_groups=sum(
            len(entries) for groups in state_masks.escapes for entries in groups.values()
        ),
    )
    return compiled
