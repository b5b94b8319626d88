"""Per-vocabulary preprocessing: every grammar-usable token as bytes in flat numpy arrays.

Tokens are grouped by first byte, so a walk from an automaton state only touches the groups
its state can start with: from a state that expects ``{`` that is 60 of Qwen2's 151,643
usable tokens rather than all of them. The walk itself is vectorised: one numpy gather per
byte column over the tokens still alive, so a state inside a JSON string (96.9% of Qwen2's
tokens contain no quote, backslash or control byte) costs about 1 ms per state on Qwen2
(0.42 s for the 340 walks of the email regex, profiled), once at compile time, and nothing
at decode time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from formline.vocab import Vocabulary

# Tokens up to this many bytes are walked once per class of states that agree on every path
# of this length; 98.7% of Qwen2's and 99.7% of SmolLM2's usable tokens are this short.
SHORT_TOKEN_BYTES = 16
ACCEPTING = 1  # bits of the per-state ``kinds`` array given to :meth:`TokenIndex.walk`
CALLING = 2


@dataclass
class WalkResult:
    """Token ids that a state's automaton reads whole, and ids that need the parser."""

    inside: np.ndarray  # int32 token ids read whole by the DFA alone
    candidates: np.ndarray  # int32 token ids that died after passing a state with calls
    escape_ids: np.ndarray  # int32 token ids that died after passing an accepting state...
    escape_offsets: np.ndarray  # ...at these offsets (one row per (token, offset) event)


class TokenIndex:
    """Flat arrays over the tokens that may appear inside a grammar.

    Special tokens (control tokens, EOS, padding) and empty tokens are left out: they are never
    allowed inside a grammar. Building costs O(total token bytes), about 0.3 s for 151k tokens.
    """

    def __init__(self, vocabulary: Vocabulary):
        usable = [
            (token[0], -len(token), token_id)
            for token_id, token in enumerate(vocabulary.token_bytes)
            if token and token_id not in vocabulary.special_ids
        ]
        usable.sort()
        self.vocabulary_size = vocabulary.size
        self.token_ids = np.array([entry[2] for entry in usable], dtype=np.int32)
        self.lengths = np.array([-entry[1] for entry in usable], dtype=np.int32)
        self.offsets = np.zeros(len(usable), dtype=np.int64)
        if len(usable):
            np.cumsum(self.lengths[:-1], out=self.offsets[1:])
        self.data = np.frombuffer(
            b"".join(vocabulary.token_bytes[entry[2]] for entry in usable), dtype=np.uint8
        )
        first_bytes = np.array([entry[0] for entry in usable], dtype=np.int64)
        self.group_starts = np.searchsorted(first_bytes, np.arange(257)).astype(np.int64)
        # Within a first-byte group tokens run longest first, so the long ones (more than
        # SHORT_TOKEN_BYTES) are a prefix of it: ``group_splits[b]`` is where short ones begin.
        long_flags = np.concatenate([[0], np.cumsum(self.lengths > SHORT_TOKEN_BYTES)])
        starts, ends = self.group_starts[:-1], self.group_starts[1:]
        self.group_splits = starts + (long_flags[ends] - long_flags[starts])

    @property
    def token_count(self) -> int:
        return len(self.token_ids)

    def walk(
        self, transitions: np.ndarray, kinds: np.ndarray, state: int, part: str = "all"
    ) -> WalkResult:
        """Walk every usable token through the byte table from ``state``.

        ``transitions`` is the flattened ``(states * 256)`` int32 table (``-1`` dead) and
        ``kinds[s]`` has bit :data:`ACCEPTING` where the state's rule may end (a return could
        continue the walk) and :data:`CALLING` where it may call a rule. A token whose bytes
        all have transitions is *inside*; a token that dies after passing a calling state (at
        offset >= 1) is a *candidate* for the full parser walk; one that dies after passing
        accepting states only gives escape events (token, offset); the rest are rejected.
        ``part`` restricts the walk to tokens of at most :data:`SHORT_TOKEN_BYTES` bytes
        ("short"), to the longer ones ("long") or takes all ("all").
        Costs O(bytes of the tokens whose first byte ``state`` accepts).
        """
        row = transitions[state * 256 : state * 256 + 256]
        allowed = np.nonzero(row >= 0)[0]
        if len(allowed) == 0:
            empty = np.zeros(0, dtype=np.int32)
            return WalkResult(empty, empty, empty, np.zeros(0, dtype=np.int64))
        starts, ends = self.group_starts[allowed], self.group_starts[allowed + 1]
        if part == "short":
            starts = self.group_splits[allowed]
        elif part == "long":
            ends = self.group_splits[allowed]
        nonempty = ends > starts
        positions = _concatenate_ranges(starts[nonempty], ends[nonempty])
        return self._walk_columns(transitions, kinds, state, positions)

    def _walk_columns(
        self, transitions: np.ndarray, kinds: np.ndarray, state: int, positions: np.ndarray
    ) -> WalkResult:
        offsets = self.offsets[positions]
        lengths = self.lengths[positions]
        states = np.full(len(positions), state, dtype=np.int64)
        called = np.zeros(len(positions), dtype=bool)
        inside_parts: list[np.ndarray] = []
        candidate_parts: list[np.ndarray] = []
        plain_dead_parts: list[np.ndarray] = []
        event_positions: list[np.ndarray] = []
        event_offsets: list[int] = []
        column = 0
        while len(positions):
            if column > 0:
                finished = lengths == column
                if finished.any():
                    inside_parts.append(positions[finished])
                    keep = ~finished
                    positions, offsets, lengths = positions[keep], offsets[keep], lengths[keep]
                    states, called = states[keep], called[keep]
                    if not len(positions):
                        break
                kind = kinds[states]
                called |= (kind & CALLING) != 0
                accepting = (kind & ACCEPTING) != 0
                if accepting.any():  # the rule could end here: the rest is a leftover
                    event_positions.append(positions[accepting])
                    event_offsets.append(column)
            following = transitions[states * 256 + self.data[offsets + column]]
            alive = following >= 0
            if not alive.all():
                dead = ~alive
                candidate_parts.append(positions[dead & called])
                plain_dead_parts.append(positions[dead & ~called])
                positions, offsets, lengths = positions[alive], offsets[alive], lengths[alive]
                states, called = following[alive], called[alive]
            else:
                states = following.astype(np.int64)
            column += 1
        escapes = self._escape_events(plain_dead_parts, event_positions, event_offsets)
        return WalkResult(
            self.token_ids[_sorted_concatenate(inside_parts)],
            self.token_ids[_sorted_concatenate(candidate_parts)],
            *escapes,
        )

    def _escape_events(
        self, plain_dead: list[np.ndarray], positions: list[np.ndarray], offsets: list[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """(token ids, offsets) where a token that died without any call passed an accepting
        state: the rule could have ended there, leaving ``token[offset:]`` to the caller."""
        if not positions or not plain_dead:
            return np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int64)
        is_plain_dead = np.zeros(self.token_count, dtype=bool)
        is_plain_dead[np.concatenate(plain_dead)] = True
        all_positions = np.concatenate(positions)
        all_offsets = np.repeat(np.array(offsets, dtype=np.int64), [len(p) for p in positions])
        keep = is_plain_dead[all_positions]
        return self.token_ids[all_positions[keep]], all_offsets[keep]


def _concatenate_ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, e) for s, e in zip(starts, ends)])`` without a Python loop."""
    lengths = ends - starts
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    shifts = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return np.arange(total, dtype=np.int64) + shifts


def _sorted_concatenate(parts: list[np.ndarray]) -> np.ndarray:
    if not parts:
        return np.zeros(0, dtype=np.int64)
    return np.sort(np.concatenate(parts))
