"""Arrays whose string items are each written once: a policy a context-free grammar cannot hold.

A small model loops: on 7 of the 12 extraction-dev contracts SmolLM2 wrote the same party
(or "SARL", or "2026") again and again until the token budget closed the array, and the
fields after it (the start date, the notice period) were then written by the budget, not
by the model. Which strings an array already holds is not a context-free property (a
grammar would need a state per subset of the items), so it is kept here, beside the
grammar: :class:`DistinctItemsMatcher` wraps a :class:`~formline.mask.matcher.GrammarMatcher`,
follows the JSON text it accepts, and, inside the tracked arrays, clears from the grammar's
mask every token that would complete an item already written, or (when the items are an
``enum``) that would start one only written items continue, or, once every choice is
written, that would open another item with a comma (only the array's end is left).

Items are compared as written (their JSON text): ``"a"`` and ``"\\u0061"`` are the same
value but not the same text, so the policy may let such a repeat through; it never refuses
a text that does not lead only to repeats. It narrows what the model samples: the text the
budget's closing policy writes (the grammar's shortest completion) may repeat an item. Items
whose schema is not plainly ``"type": "string"`` (a nullable string) are not tracked, and
an array whose path another array with other items shares keeps no enum. When every
grammar-allowed token is refused (an enum whose choices are all written while
``minItems`` asks for more), the grammar's mask is kept: the policy narrows, it never
blocks.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from formline.mask.matcher import GrammarMatcher

Path = tuple[str, ...]  # object keys, "*" for an array's items
WHITESPACE = b" \t\r\n"


class _Frame:
    """One open container of the JSON text being followed."""

    __slots__ = ("expects_key", "is_array", "items", "key", "path", "tracked")

    def __init__(self, is_array: bool, tracked: bool, path: Path):
        self.is_array = is_array
        self.path = path
        self.key = ""
        self.expects_key = not is_array
        self.items: list[bytes] = []  # the string items written (tracked arrays)
        self.tracked = tracked


def read_string_byte(escaped: bool, byte: int) -> tuple[bool, bool]:
    """One byte inside a JSON string, after an escaping backslash or not: (whether the next
    byte is escaped, whether this one closes the string)."""
    if escaped:
        return False, False
    return byte == 0x5C, byte == 0x22


class JsonFollower:
    """Where a JSON text stands after the bytes fed so far: the open containers, their
    keys, and the string being written. Costs O(1) per byte."""

    def __init__(self, tracked: Iterable[Path]):
        self.tracked = frozenset(tracked)
        self.stack: list[_Frame] = []
        self.in_string = False
        self.escaped = False
        self.string = bytearray()

    def path(self) -> Path:
        return tuple("*" if frame.is_array else frame.key for frame in self.stack)

    def item_array(self) -> _Frame | None:
        """The tracked array whose items are being written directly, if any."""
        frame = self.stack[-1] if self.stack else None
        return frame if frame is not None and frame.is_array and frame.tracked else None

    def feed(self, data: bytes) -> None:
        for byte in data:
            self.feed_byte(byte)

    def feed_byte(self, byte: int) -> None:
        if self.in_string:
            self._string_byte(byte)
        elif byte == 0x22:  # "
            self.in_string, self.string = True, bytearray()
        elif byte in (0x7B, 0x5B):  # { [
            is_array, path = byte == 0x5B, self.path()
            self.stack.append(_Frame(is_array, is_array and path in self.tracked, path))
        elif byte in (0x7D, 0x5D) and self.stack:  # } ]
            self.stack.pop()
        elif byte == 0x2C and self.stack and not self.stack[-1].is_array:  # ,
            self.stack[-1].expects_key = True

    def _string_byte(self, byte: int) -> None:
        self.escaped, closes = read_string_byte(self.escaped, byte)
        if closes:
            self.in_string = False
            self._close_string(bytes(self.string))
        else:
            self.string.append(byte)

    def _close_string(self, text: bytes) -> None:
        frame = self.stack[-1] if self.stack else None
        if frame is None:
            return
        if not frame.is_array and frame.expects_key:
            frame.key = json.loads(b'"' + text + b'"')
            frame.expects_key = False
        elif frame.tracked:
            frame.items.append(text)


class DistinctItemsMatcher:
    """``inner``'s grammar, plus: the string items of each array at a path of ``arrays``
    are distinct (see the module). ``arrays`` maps a path (keys, ``"*"`` for items) to the
    items' ``enum`` (its strings), or to ``None`` when they are free strings.

    Costs, per step inside a tracked array that holds an item already, a scan of the bytes
    of the allowed tokens that hold a quote (only those can close or open an item: 163 of
    SmolLM2's 49,152 tokens, 1,345 of Llama-3's; once an enum's choices are all written, those
    that hold a comma too), or inside an enum item of every allowed token (the grammar
    allows few there); nothing otherwise. Inside a free string item, the
    grammar's fill included: 0.16-0.17 ms a step on SmolLM2, 0.46-0.48 ms on Llama-3, where
    scanning every allowed token (48,787 and 123,234) cost 80-82 and 194-196 ms
    (``python -m bench.policy_bench``, bench/results/policy.md).
    """

    def __init__(self, inner: GrammarMatcher, arrays: Mapping[Path, Sequence[str] | None]):
        self.inner = inner
        self.arrays = dict(arrays)
        self._choices = {
            path: sorted({json.dumps(value, ensure_ascii=False)[1:-1].encode() for value in items})
            for path, items in self.arrays.items()
            if items is not None
        }
        vocabulary = inner.compiled.vocabulary
        self._pieces = vocabulary.token_bytes
        self._vocabulary_size = vocabulary.size
        # The tokens holding a quote (the only ones that can close or open an item), as the
        # mask words and bits to test: made once, not at every step.
        self._quoted = _TokenBits(vocabulary.tokens_with_byte(0x22))
        # Once every enum choice is written, a comma can only lead to a repeat: the tokens
        # holding one are scanned too then (126 of SmolLM2's tokens hold a comma, 861 of Llama-3's).
        self._commas = _TokenBits(vocabulary.tokens_with_byte(0x2C))
        self._accepted: list[bytes] = []
        self.follower = JsonFollower(self.arrays)

    def __getattr__(self, name: str) -> Any:
        """The grammar matcher's own policies and state (jump-forward, closing, rollback
        limit, ...): only the mask and the accepted text are this class's."""
        if name == "inner":  # not set yet (a copy under construction): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def reset(self) -> None:
        self.inner.reset()
        self._accepted = []
        self.follower = JsonFollower(self.arrays)

    def accept_token(self, token_id: int) -> bool:
        if not self.inner.accept_token(token_id):
            return False
        self._accepted.append(self._pieces[token_id])
        self.follower.feed(self._pieces[token_id])
        return True

    def accept_tokens(self, token_ids: Sequence[int]) -> bool:
        if not self.inner.accept_tokens(token_ids):
            return False
        for token_id in token_ids:
            self._accepted.append(self._pieces[token_id])
            self.follower.feed(self._pieces[token_id])
        return True

    def accept_string(self, text: str | bytes) -> bool:
        """Advance by raw text (one history entry, as the grammar's matcher counts it)."""
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        if not self.inner.accept_string(data):
            return False
        self._accepted.append(data)
        self.follower.feed(data)
        return True

    def state_key(self) -> Any:
        """The grammar's state and the text written: two states with the same grammar
        state may hold different items, so different masks."""
        return (self.inner.state_key(), b"".join(self._accepted))

    def rollback(self, num_tokens: int = 1) -> None:
        """Undo tokens; the follower reads the kept text again (rollbacks are rare: the
        loop's budget policies, at most a few per answer)."""
        self.inner.rollback(num_tokens)
        del self._accepted[len(self._accepted) - num_tokens :]
        self.follower = JsonFollower(self.arrays)
        for piece in self._accepted:
            self.follower.feed(piece)

    def fill_next_token_bitmask(self, bitmask: Any, index: int = 0) -> bool:
        """The grammar's mask, less the tokens that repeat an item (numpy bitmasks only:
        a torch buffer gets the grammar's mask alone)."""
        self.inner.fill_next_token_bitmask(bitmask, index)
        array = self.follower.item_array()
        if array is None or not array.items or not isinstance(bitmask, np.ndarray):
            return True
        row = (bitmask[index] if bitmask.ndim == 2 else bitmask).view(np.uint32)
        choices = self._choices.get(array.path)
        if choices is None or not self.follower.in_string:
            # Only a token holding a quote can close an item or open one (_repeats): the
            # allowed ones among them. Scanning every allowed token cost 80-82 ms a step
            # inside a free string item on SmolLM2, 194-196 on Llama-3 (bench.policy_bench).
            candidates = self._quoted.allowed_in(row)
            if choices is not None and _is_exhausted(array.items, choices):
                candidates = np.union1d(candidates, self._commas.allowed_in(row))
        else:  # an enum's prefix: the grammar allows a few tokens, any may end the choices
            flags = np.unpackbits(row.view(np.uint8), bitorder="little")[: self._vocabulary_size]
            candidates = np.flatnonzero(flags)
        refused = [
            token
            for token in candidates.tolist()
            if self._repeats(self._pieces[token], array.items, choices)
        ]
        if refused:
            ids = np.asarray(refused, dtype=np.int64)
            narrowed = row.copy()
            np.bitwise_and.at(narrowed, ids >> 5, ~(np.uint32(1) << (ids & 31).astype(np.uint32)))
            if narrowed.any():  # else every allowed token was refused: the grammar's mask stays
                row[:] = narrowed
        return True

    def _repeats(self, piece: bytes, written: list[bytes], choices: list[bytes] | None) -> bool:
        """Whether ``piece``, read from here, completes a written item or (with
        ``choices``) leaves an item that only written choices continue."""
        follower = self.follower
        in_string, escaped, text = follower.in_string, follower.escaped, bytes(follower.string)
        closed: list[bytes] = []  # the items this piece itself closes
        for byte in piece:
            if in_string:
                escaped, closes = read_string_byte(escaped, byte)
                if closes and (text in written or text in closed):
                    return True
                if closes:
                    in_string = False
                    closed.append(text)
                    continue
                text += bytes((byte,))
            elif byte == 0x22:
                in_string, text = True, b""
            elif byte == 0x2C:
                if choices is not None and _is_exhausted([*written, *closed], choices):
                    return True  # another item: every choice it could be is written
            elif byte not in WHITESPACE:
                return False  # the array closes, or something other than a string item
        if not in_string or choices is None or b"\\" in text:
            return False  # an escape is compared as written, choices are not: let it be
        written = [*written, *closed]
        return any(item.startswith(text) for item in written) and not _is_continued(
            text, written, choices
        )


class _TokenBits:
    """Sorted token ids with their mask word indices and bit shifts, made once, not at every
    step."""

    __slots__ = ("bits", "tokens", "words")

    def __init__(self, tokens: np.ndarray):
        self.tokens = tokens
        self.words, self.bits = tokens >> 5, (tokens & 31).astype(np.uint32)

    def allowed_in(self, row: np.ndarray) -> np.ndarray:
        """The tokens whose bit is set in ``row`` (uint32 mask words)."""
        result: np.ndarray = self.tokens[(row[self.words] >> self.bits) & 1 == 1]
        return result


def _is_exhausted(written: list[bytes], choices: list[bytes]) -> bool:
    """Whether every choice is among the items written (as written: see the module). O(1)
    while fewer items than choices are written: under ``verbatim`` a free string's choices
    are the source's spans (up to 4,000), and this runs per step and per comma token."""
    return len(written) >= len(choices) and set(choices) <= set(written)


def _is_continued(prefix: bytes, written: list[bytes], choices: list[bytes]) -> bool:
    """Whether some choice not yet written starts with ``prefix``."""
    start = bisect.bisect_left(choices, prefix)
    for choice in choices[start:]:
        if not choice.startswith(prefix):
            return False
        if choice not in written:
            return True
    return False
