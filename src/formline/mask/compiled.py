"""The compiled grammar: a grammar bound to a vocabulary, with per-state token masks.

For every automaton state that can read a byte, compilation stores:

* an *inside* mask: the tokens whose bytes the state's DFA reads whole. They are allowed
  whatever the parser stack below holds (XGrammar's "context-independent" tokens);
* *escape groups*: tokens that leave the current rule part-way (a string's closing quote
  followed by ``,`` in ``"abc",``), grouped by the bytes left over once the rule has ended.
  Only those leftovers depend on the stack below, and there are few distinct ones (``,``,
  ``]``, ``},``...), so decoding checks a few dozen short byte strings, not tokens.

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

from formline.mask.bitmask import ids_to_bitmask, words_for
from formline.mask.token_index import TokenIndex
from formline.parser.pushdown import BASE, PushdownAutomaton, Stack
from formline.vocab import Vocabulary

DEFAULT_MASK_CACHE_ENTRIES = 4096


@dataclass
class StateMasks:
    """Precomputed per-state data (picklable: this is what the disk cache stores)."""

    inside_index: np.ndarray  # int32 (states,): row of ``inside_masks``, -1 if none
    inside_masks: np.ndarray  # uint32 (unique masks, words)
    escapes: list[list[tuple[bytes, np.ndarray]]]  # per state: (leftover bytes, token ids)
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

    Costs one vectorised token walk per state (O(bytes of the tokens the state can start))
    plus a Python parser walk per candidate token (tokens that cross a rule boundary).
    """
    flat = automaton.transitions.reshape(-1)
    special = np.array(automaton.is_special, dtype=bool)
    words = words_for(vocabulary.size)
    unique: dict[bytes, int] = {}
    masks: list[np.ndarray] = []
    inside_index = np.full(automaton.size, -1, dtype=np.int32)
    escapes: list[list[tuple[bytes, np.ndarray]]] = []
    # Stacks whose top is in an uncalled start rule have nothing below them: their escape
    # groups could never apply, and without any call edge no candidate can be read whole.
    start_is_called = any(
        callee == automaton.start for calls in automaton.calls for callee, _ in calls
    )
    has_calls = any(automaton.calls)
    for state in range(automaton.size):
        if not automaton.has_bytes[state]:
            escapes.append([])
            continue
        result = index.walk(flat, special, state)
        in_start_rule = automaton.rule_of_state[state] == 0 and not start_is_called
        if in_start_rule and not has_calls:
            extra_inside, groups = [], {}
        else:
            extra_inside, groups = _classify_candidates(
                automaton, vocabulary, state, result.candidates
            )
            if in_start_rule:
                groups = {}
        token_ids = result.inside
        if extra_inside:
            token_ids = np.union1d(token_ids, np.array(extra_inside, dtype=np.int32))
        mask = ids_to_bitmask(token_ids, words)
        key = mask.tobytes()
        if key not in unique:
            unique[key] = len(masks)
            masks.append(mask)
        inside_index[state] = unique[key]
        escapes.append(
            [(leftover, np.array(ids, dtype=np.int32)) for leftover, ids in sorted(groups.items())]
        )
    live_bytes = [tuple(np.nonzero(row >= 0)[0].tolist()) for row in automaton.transitions]
    stacked = np.stack(masks) if masks else np.zeros((0, words), dtype=np.uint32)
    return StateMasks(inside_index, stacked, escapes, live_bytes)


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
        self._leftover_cache: dict[tuple[Stack, bytes], bool] = {}

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
        self, words: np.ndarray, stack: Stack, groups: list[tuple[bytes, np.ndarray]]
    ) -> None:
        below = stack[:-1]
        closed: frozenset[Stack] | None = None
        for leftover, token_ids in groups:
            key = (below, leftover)
            allowed = self._leftover_cache.get(key)
            if allowed is None:
                if closed is None:
                    closed = self.automaton.closure([below])[0]
                allowed = self.automaton.accepts_after(closed, leftover)
                if len(self._leftover_cache) < 1_000_000:
                    self._leftover_cache[key] = allowed
            if allowed:
                np.bitwise_or.at(
                    words, token_ids >> 5, np.left_shift(1, token_ids & 31).astype(np.uint32)
                )

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
        escape_groups=sum(len(groups) for groups in state_masks.escapes),
    )
    return compiled
