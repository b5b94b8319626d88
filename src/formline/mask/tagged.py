"""Free text first, then the grammar: a bounded rationale before a constrained answer.

"Reason free, constrain late": a small model constrained from its first token loses the
words it would have used to think. :class:`TaggedMatcher` is a structural tag in
llguidance's lazy-grammar sense, with the grammar's first byte as the trigger: while the
model writes free text (at most ``free_tokens`` tokens) the mask allows every token except
stop and special tokens, and tokens that contain the trigger (``{`` for a JSON object)
unless what follows the trigger in them starts the grammar; the first such token opens the
answer, and from there the grammar's own matcher masks every step, exactly. When the free
budget is spent the answer opens at once. The rationale (the free text) is kept apart
(:attr:`TaggedMatcher.rationale`): it is never part of the value.

It has the matcher's shape (``fill_next_token_bitmask``, ``accept_token``, the decoding
policies), so the one decoding loop drives it unchanged.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from formline.errors import FormlineError
from formline.mask.compiled import CompiledGrammar
from formline.mask.matcher import GrammarMatcher, Tokenize

CACHE_LIMIT = 64  # free-text masks kept, one per (compiled grammar, trigger)
_free_masks: dict[tuple[int, bytes], tuple[CompiledGrammar, np.ndarray]] = {}
_free_masks_lock = threading.Lock()


class TagError(FormlineError, ValueError):
    """The grammar has no fixed first byte to open the answer with."""


def trigger_of(compiled: CompiledGrammar) -> bytes:
    """The byte every text of the grammar starts with (``{`` for an object schema).

    Raises:
        TagError: the grammar can start with several bytes (or none).
    """
    forced = GrammarMatcher(compiled).find_jump_forward_string().encode("utf-8")
    if not forced:
        raise TagError(
            "thinking before the answer needs a grammar whose text starts with one fixed "
            "byte (an object schema's '{', an array's '['); this one can start several ways"
        )
    return forced[:1]


def free_text_mask(compiled: CompiledGrammar, trigger: bytes) -> np.ndarray:
    """The free phase's allowed tokens as uint32 words: all but stop and special tokens,
    and, of the tokens containing ``trigger``, only those whose text from the trigger on
    starts the grammar. Cached per compiled grammar; costs one scan of the vocabulary's
    token bytes plus a walk of each token with the trigger: 8 ms for SmolLM2's 49k tokens
    and a person schema (measured once per compile, not per token)."""
    key = (id(compiled), trigger)
    with _free_masks_lock:
        found = _free_masks.get(key)
        if found is not None and found[0] is compiled:
            return found[1]
    vocabulary = compiled.vocabulary
    automaton = compiled.automaton
    start = automaton.initial()[0]
    flags = np.ones(compiled.vocabulary_size, dtype=bool)
    flags[[*vocabulary.eos_ids, *vocabulary.special_ids]] = False
    for token, piece in enumerate(vocabulary.token_bytes):
        at = piece.find(trigger)
        if at >= 0 and compiled.advance_bytes(start, piece[at:]) is None:
            flags[token] = False
    words = np.packbits(flags, bitorder="little")
    padded = np.zeros(4 * ((words.size + 3) // 4), dtype=np.uint8)
    padded[: words.size] = words
    mask = padded.view("<u4").astype(np.uint32)
    with _free_masks_lock:
        if len(_free_masks) >= CACHE_LIMIT:
            _free_masks.pop(next(iter(_free_masks)))
        _free_masks[key] = (compiled, mask)
    return mask


class TaggedMatcher:
    """At most ``free_tokens`` tokens of free text, then the grammar of ``compiled``.

    Raises (at construction):
        TagError: the grammar has no fixed first byte (see :func:`trigger_of`).
    Costs :func:`free_text_mask` once per compiled grammar; a free step costs a copy of
    the mask, an answer step what the grammar's matcher costs.
    """

    def __init__(self, compiled: CompiledGrammar, free_tokens: int):
        self.inner = GrammarMatcher(compiled)
        self.compiled = compiled
        self.trigger = trigger_of(compiled)
        self.free_mask = free_text_mask(compiled, self.trigger)
        self.free_tokens = free_tokens
        self.free_used = 0
        self.is_answering = free_tokens <= 0
        self._rationale = bytearray()
        self._pieces = compiled.vocabulary.token_bytes
        # What each accepted token did, for rollback: ("free", bytes), ("entry", bytes of
        # free text before the trigger), ("open", 0: the answer opened on a closing), or
        # ("inner", 0: a step of the grammar's matcher).
        self._events: list[tuple[str, int]] = []

    @property
    def rationale(self) -> str:
        """The free text written before the answer (without the trigger)."""
        return self._rationale.decode("utf-8", errors="replace")

    @property
    def rationale_bytes(self) -> bytes:
        """The free text's bytes: the output's text starts with them."""
        return bytes(self._rationale)

    def is_terminated(self) -> bool:
        return self.is_answering and self.inner.is_terminated()

    def can_end(self) -> bool:
        return self.is_answering and self.inner.can_end()

    def state_key(self) -> Any:
        return (self.is_answering, self.free_used, self.inner.state_key())

    def fill_next_token_bitmask(self, bitmask: Any, index: int = 0) -> bool:
        """This step's mask: the free-text mask, or the grammar's once answering.

        Raises:
            TypeError: a free step's buffer is not a numpy array (the grammar's matcher
                also takes torch tensors).
        """
        if self.is_answering:
            return self.inner.fill_next_token_bitmask(bitmask, index)
        if not isinstance(bitmask, np.ndarray):
            raise TypeError("a free-text step fills a numpy bitmask only")
        row = bitmask[index] if bitmask.ndim == 2 else bitmask
        row[: self.free_mask.shape[0]] = self.free_mask.view(np.int32)
        row[self.free_mask.shape[0] :] = 0
        return True

    def accept_token(self, token_id: int) -> bool:
        """Advance by one token (``False``, unchanged, for a token the step refuses)."""
        if self.is_answering:
            accepted = self.inner.accept_token(token_id)
            if accepted:
                self._events.append(("inner", 0))
            return accepted
        if not 0 <= token_id < len(self._pieces):  # -1 read bit 31 of the last word
            self.inner._check_id(token_id)  # the grammar matcher's TokenError
            return False
        if not self.free_mask[token_id >> 5] >> (token_id & 31) & 1:
            return False
        piece = self._pieces[token_id]
        at = piece.find(self.trigger)
        if at >= 0:
            if not self.inner.accept_string(piece[at:]):
                return False
            self._rationale += piece[:at]
            self.is_answering = True
            self._events.append(("entry", at))
            return True
        self._rationale += piece
        self._events.append(("free", len(piece)))
        self.free_used += 1
        self.is_answering = self.free_used >= self.free_tokens
        return True

    def accept_tokens(self, token_ids: Sequence[int]) -> bool:
        """Accept all of ``token_ids`` or none. Outside the answer they are the answer's
        opening (a closing completion): the answer opens first."""
        if not token_ids:  # nothing to open the answer with: no event to roll back
            return True
        if not self.is_answering:
            if not self.inner.accept_tokens(token_ids):
                return False
            self.is_answering = True
            self._events.append(("open", 0))
        elif not self.inner.accept_tokens(token_ids):
            return False
        self._events.extend(("inner", 0) for _ in token_ids)
        return True

    def jump_forward_tokens(self, tokenize: Tokenize, room: int) -> list[int]:
        """The grammar's forced tokens once answering; nothing is forced in free text."""
        return self.inner.jump_forward_tokens(tokenize, room) if self.is_answering else []

    def closing_tokens(self, remaining: int, tokenize: Tokenize) -> list[int]:
        """The shortest answer when it must start now to fit ``remaining`` tokens."""
        return self.inner.closing_tokens(remaining, tokenize)

    def completion_tokens(self, tokenize: Tokenize) -> list[int] | None:
        """The shortest answer's tokens from here (the whole answer before it opens)."""
        return self.inner.completion_tokens(tokenize)

    def rollback(self, num_tokens: int = 1) -> None:
        """Undo the last ``num_tokens`` accepted tokens, free text included.

        Raises:
            ValueError: more tokens than were accepted.
        """
        if num_tokens < 0 or num_tokens > len(self._events):
            raise ValueError(f"cannot roll back {num_tokens} tokens: {len(self._events)} can be")
        for _ in range(num_tokens):
            kind, size = self._events.pop()
            if kind == "inner":
                self.inner.rollback(1)
                if self._events and self._events[-1][0] == "open":
                    self._events.pop()
                    self.is_answering = False
                continue
            if kind == "entry":
                self.inner.rollback(1)
            else:
                self.free_used -= 1
            if size:
                del self._rationale[-size:]
            self.is_answering = self.free_used >= self.free_tokens

    def is_only_stop_allowed(self) -> bool:
        return self.is_answering and self.inner.is_only_stop_allowed()
