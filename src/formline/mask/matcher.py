"""The matcher: the per-sequence parse state, in XGrammar's and llguidance's shape.

A matcher is cheap (a reference to the compiled grammar and a history of configurations),
so a server makes one per request. ``fill_next_token_bitmask`` writes the allowed tokens,
``accept_token`` advances (a refused token changes nothing), ``rollback`` undoes tokens.

It also owns the decoding policies every loop needs, given the engine's ``tokenize``
(bytes to token ids, no special tokens): :meth:`GrammarMatcher.jump_forward_tokens` (the
forced text, tokenized canonically, its last tokens backed off where the model would merge
them with what follows, as llguidance's fast-forward does), :meth:`GrammarMatcher.closing_tokens`
(the shortest completion, when it only just fits the tokens left) and
:meth:`GrammarMatcher.is_only_stop_allowed` (the grammar has ended). Each computes tokens
from the current state without changing it; the caller accepts what it feeds.
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from formline.errors import FormlineError
from formline.mask.bitmask import check_bitmask
from formline.mask.compiled import CompiledGrammar
from formline.native import MatcherCore, copy_mask, copy_mask_row
from formline.parser.pushdown import Stack

MAX_JUMP_FORWARD_BYTES = 4096
MAX_BACK_OFF = 4  # trailing forced tokens re-checked for a merge across the end (llguidance: 4)
CLOSING_MARGIN_TOKENS = 2  # one model token can lengthen the shortest completion: keep slack
CLOSING_WINDOW_TOKENS = 96  # search for a completion only this close to the budget's end
Tokenize = Callable[[bytes], Sequence[int]]


class TokenError(FormlineError, ValueError):
    """A token id outside the vocabulary (the logits size)."""


class GrammarMatcher(MatcherCore):
    """Parse state of one sequence under a compiled grammar.

    The per-token calls (``accept_token``, ``state_key``, ``can_end``, ``is_terminated``) and
    the state they read are :class:`formline.native.MatcherCore`'s, in C; the rest is here.

    Args:
        compiled: the compiled grammar (shared, read-only).
        max_rollback_tokens: how many accepted tokens :meth:`rollback` can undo (``None`` or
            a negative number, XGrammar's ``-1``: unlimited). Each kept step costs one tuple
            reference.

    Raises:
        TypeError: ``compiled`` is not a compiled grammar, or ``max_rollback_tokens`` not an
            integer.
    """

    def __init__(self, compiled: CompiledGrammar, max_rollback_tokens: int | None = None):
        compiled = getattr(compiled, "compiled_grammar", compiled)  # a CompiledSchema
        if not isinstance(compiled, CompiledGrammar):
            raise TypeError(
                f"GrammarMatcher takes a compiled grammar, not {type(compiled).__name__}"
            )
        if max_rollback_tokens is not None:
            # -1, XGrammar's default, emptied the history at every step: no rollback at all.
            limit = operator.index(max_rollback_tokens)
            max_rollback_tokens = None if limit < 0 else limit
        super().__init__(compiled, max_rollback_tokens)
        self._automaton = compiled.automaton
        self.reset()

    def reset(self) -> None:
        """Back to the start of the grammar. Costs one closure."""
        self._stacks, self._can_end = self._automaton.initial()
        self._terminated = False
        self._history = []
        self._mask = None

    def _check_id(self, token_id: int) -> None:
        if not 0 <= token_id < self.compiled.vocabulary_size:
            raise TokenError(
                f"token id {token_id} is outside the vocabulary of "
                f"{self.compiled.vocabulary_size} tokens"
            )

    def _push(self, stacks: frozenset[Stack], can_end: bool, terminated: bool) -> None:
        self._history.append((self._stacks, self._can_end, self._terminated))
        if self.max_rollback_tokens is not None and len(self._history) > self.max_rollback_tokens:
            del self._history[0]
        self._stacks, self._can_end, self._terminated = stacks, can_end, terminated
        self._mask = None

    def accept_tokens(self, token_ids: Sequence[int]) -> bool:
        """Accept every token of ``token_ids``, or none (``False``, state unchanged).

        Raises:
            TokenError: an id outside the vocabulary.
        """
        # Ints once, before anything is accepted: an iterator was used up by the check and
        # nothing accepted (True); a float whose int was a cached step was taken halfway.
        token_ids = [operator.index(token_id) for token_id in token_ids]
        for token_id in token_ids:
            if not 0 <= token_id < self._vocabulary_size:
                self._check_id(token_id)
        body = list(token_ids)
        # A stop token may come last, where the grammar can end (as accept_token takes it;
        # the walk steps bytes, and refused it).
        ends = bool(body) and body[-1] in self.compiled.vocabulary.eos_ids
        if ends:
            body.pop()
        walked = None if self._terminated else self._walk(body)
        if walked is None:
            return False  # checked first: a rollback limit must not stop the undo
        if ends and not self._can_end_after(walked, body):
            return False
        for token_id in token_ids:
            self.accept_token(token_id)
        return True

    def accept_string(self, text: str | bytes) -> bool:
        """Advance by raw text (not tokens); ``False`` (state unchanged) if refused.

        One rollback step undoes the whole string. Costs O(len(text) x stacks).
        """
        if self._terminated:
            return False
        data = text.encode("utf-8") if isinstance(text, str) else text
        if not data:  # the kernel's step of no bytes says "cannot end": keep the state's
            self._push(self._stacks, self._can_end, False)
            return True
        result = self.compiled.advance_bytes(self._stacks, data)
        if result is None:
            return False
        self._push(result[0], result[1], False)
        return True

    def rollback(self, num_tokens: int = 1) -> None:
        """Undo the last ``num_tokens`` accepted tokens (or strings).

        Raises:
            ValueError: more tokens than the history holds.
        """
        if num_tokens < 0 or num_tokens > len(self._history):
            raise ValueError(
                f"cannot roll back {num_tokens} tokens: {len(self._history)} can be undone"
            )
        for _ in range(num_tokens):
            self._stacks, self._can_end, self._terminated = self._history.pop()
        self._mask = None

    def next_token_mask_words(self) -> np.ndarray:
        """This step's allowed tokens as read-only uint32 words (shared; do not modify)."""
        if self._mask is None:
            if self._terminated:
                self._mask = self.compiled.eos_mask
            else:
                self._mask = self.compiled.mask_words(self._stacks, self._can_end)
        return self._mask

    def cached_mask_words(self) -> np.ndarray | None:
        """This step's mask if it needs no computing (cached or terminated), else ``None``."""
        if self._mask is None:
            if self._terminated:
                self._mask = self.compiled.eos_mask
            else:
                self._mask = self.compiled.cached_mask(self._stacks, self._can_end)
        return self._mask

    def fill_next_token_bitmask(self, bitmask: Any, index: int = 0) -> bool:
        """Write this step's allowed tokens into row ``index`` of an int32 bitmask.

        ``bitmask`` comes from :func:`allocate_token_bitmask` (numpy) or is a torch int32
        tensor of the same shape. Words beyond the vocabulary are zeroed. Returns ``True`` (the
        mask must be applied), matching XGrammar's signature.
        Costs a cached lookup plus a copy of ceil(V/32) words (about 4,700 for Qwen2).

        Raises:
            ValueError: the buffer is not int32, not 1- or 2-dimensional, has fewer words
                per row than ceil(V/32) (a short row used to be filled in part, silently),
                or ``index`` is not one of its rows.
            TypeError: neither a numpy array nor a torch tensor.
        """
        mask = self._mask if self._mask is not None else self.next_token_mask_words()
        if type(bitmask) is np.ndarray and type(index) is int and bitmask.ndim == 2:
            try:  # the common buffer, checked in C; anything else takes the path below
                copy_mask_row(mask, bitmask, index)
                return True
            except ValueError:
                pass
        if isinstance(bitmask, np.ndarray):
            is_int32 = bitmask.dtype == np.int32
            check_bitmask(bitmask.shape, is_int32, bitmask.dtype, index, mask.shape[0])
            row = bitmask[index] if bitmask.ndim == 2 else bitmask
            if row.flags.c_contiguous and row.flags.writeable:
                copy_mask(mask, row)
            else:
                row[: mask.shape[0]] = mask.view(np.int32)
                row[mask.shape[0] :] = 0
            return True
        words = mask.view(np.int32)
        torch = sys.modules.get("torch")
        if torch is None or not isinstance(bitmask, torch.Tensor):
            raise TypeError(
                f"bitmask must be a numpy array or a torch tensor, got {type(bitmask).__name__}"
            )
        is_int32 = bitmask.dtype == torch.int32
        check_bitmask(tuple(bitmask.shape), is_int32, bitmask.dtype, index, words.shape[0])
        row = bitmask[index] if bitmask.dim() == 2 else bitmask
        row[: words.shape[0]].copy_(torch.from_numpy(words.copy()))
        row[words.shape[0] :] = 0
        return True

    def allowed_token_ids(self) -> np.ndarray:
        """The allowed token ids of this step (for tests and debugging). Costs O(V)."""
        words = self.next_token_mask_words()
        flags = np.unpackbits(words.view(np.uint8), bitorder="little")[
            : self.compiled.vocabulary_size
        ]
        return np.nonzero(flags)[0]

    def shortest_completion(self, max_bytes: int = 512) -> bytes | None:
        """The shortest byte string that lets the grammar end from here (``b""`` if it can
        end now; ``None`` past ``max_bytes`` or when terminated). The matcher's state does
        not change. Costs a lookup when the compiled grammar has answered for this
        configuration before, else its breadth-first search
        (:meth:`CompiledGrammar.shortest_completion`)."""
        if self._terminated:
            return None
        if self._can_end:
            return b""
        return self.compiled.shortest_completion(self._stacks, max_bytes)

    def find_jump_forward_string(self) -> str:
        """The text the grammar forces next (empty if the next byte is not unique).

        Stops where the grammar could end, and at most 4 KiB ahead. The matcher's state does
        not change. The result is cut to whole UTF-8 characters. Costs O(forced bytes x stacks).
        """
        if self._terminated:
            return ""
        forced = bytearray()
        stacks, can_end = self._stacks, self._can_end
        live_bytes = self.compiled.live_bytes
        while not can_end and len(forced) < MAX_JUMP_FORWARD_BYTES:
            candidates = {byte for stack in stacks for byte in live_bytes[stack[-1]]}
            if len(candidates) != 1:
                break
            byte = candidates.pop()
            result = self.compiled.advance_bytes(stacks, bytes((byte,)))
            if result is None:
                break
            stacks, can_end = result
            forced.append(byte)
        return _utf8_prefix(bytes(forced))

    # ------------------------------------------------------------ decoding policies

    def is_only_stop_allowed(self) -> bool:
        """Whether the grammar has ended: only stop tokens are allowed next. Costs nothing
        unless the text can end, then one comparison of ceil(V/32) words (1,536 for SmolLM2)."""
        if not self.can_end():
            return False
        return bool(np.array_equal(self.next_token_mask_words(), self.compiled.eos_mask))

    def jump_forward_tokens(
        self, tokenize: Tokenize, room: int, back_off: int = MAX_BACK_OFF
    ) -> list[int]:
        """The tokens to feed for the text the grammar forces next; the state is unchanged.

        The forced text (:meth:`find_jump_forward_string`) is tokenized on its own, so its
        last tokens may split what the model would write as one token across the end:
        forcing ``"The capital of "`` as ``[The, capital, of, " "]`` leaves a lone space
        where SmolLM2 writes ``" France"``. As llguidance does, up to ``back_off`` trailing
        tokens are dropped while a token the grammar allows at their start would extend
        past them. ``[]`` when nothing is forced, there is no ``room``, or the tokens do not
        spell the text (SentencePiece's leading space) or are refused.

        Costs the forced text's walk, one ``tokenize`` call, one step per token and, for the
        back-off, up to ``back_off`` mask lookups plus a scan of the tokens with that prefix.
        """
        if room <= 0 or self._terminated:
            return []
        forced = self.find_jump_forward_string().encode("utf-8")
        if not forced:
            return []
        tokens = self._spelled(tokenize, forced)[:room]
        states = self._walk(tokens)
        if not tokens or states is None:
            return []
        index = self.compiled.vocabulary.prefix_index
        pieces = self.compiled.vocabulary.token_bytes
        keep, suffix = len(tokens), b""
        for start in range(len(tokens) - 1, max(0, len(tokens) - back_off) - 1, -1):
            suffix = pieces[tokens[start]] + suffix
            stacks, can_end = states[start]
            if index.extended_by_allowed(suffix, self.compiled.mask_words(stacks, can_end)):
                keep = start
        return tokens[:keep]

    def closing_tokens(self, remaining: int, tokenize: Tokenize) -> list[int]:
        """The tokens of the shortest completion when it must start now to fit in
        ``remaining`` tokens (a small model looping on array items still ends with a
        complete value); ``[]`` otherwise, when it no longer fits, or when its tokens do not
        spell it. The state is unchanged. Costs one breadth-first search (about 1 ms for
        the extraction-dev schemas) per step inside the last CLOSING_WINDOW_TOKENS."""
        if remaining > CLOSING_WINDOW_TOKENS or self._terminated:
            return []
        completion = self.shortest_completion()
        if not completion:
            return []
        tokens = self._spelled(tokenize, completion)
        if not tokens or len(tokens) + CLOSING_MARGIN_TOKENS < remaining:
            return []
        if len(tokens) > remaining or self._walk(tokens) is None:
            return []
        return tokens

    def completion_tokens(self, tokenize: Tokenize) -> list[int] | None:
        """The tokens of the shortest completion from here (``[]`` when the grammar can end
        now; ``None`` when there is none within 512 bytes or its tokens do not spell it).
        The state is unchanged. Costs one breadth-first search."""
        completion = self.shortest_completion()
        if completion is None:
            return None
        tokens = self._spelled(tokenize, completion) if completion else []
        return tokens if tokens or not completion else None

    def _spelled(self, tokenize: Tokenize, data: bytes) -> list[int]:
        """Tokens that spell exactly ``data`` (``[]`` when none are found). Leading UTF-8
        continuation bytes (the rest of a character a token began) are their own token, or
        one token each: a tokenizer reads text, and replaced them (after SmolLM2's
        ``b"\xe4\xb8"`` no closing was ever written)."""
        vocabulary = self.compiled.vocabulary
        lead = 0
        while lead < min(3, len(data)) and 0x80 <= data[lead] < 0xC0:
            lead += 1
        head: list[int | None] = []
        if lead:
            whole = vocabulary.token_id(data[:lead])
            head = [whole] if whole is not None else [
                vocabulary.token_id(data[k : k + 1]) for k in range(lead)
            ]  # fmt: skip
            if None in head:
                return []
        rest = self._text_tokens(tokenize, data[lead:]) if lead < len(data) else []
        if lead < len(data) and not rest:
            return []
        return [int(token) for token in head if token is not None] + rest

    def _text_tokens(self, tokenize: Tokenize, text: bytes) -> list[int]:
        """``tokenize(text)`` when it spells ``text``; else the tokens after the newline in
        ``tokenize(b"\n" + text)`` (or after `` \n``) when those spell it: a SentencePiece
        tokenizer writes a leading space (phi-3's ``'"]}'`` came back ``' "', ']}'``), so no
        closing or forced text was ever written for those models. ``[]`` when neither does."""
        tokens = [int(token) for token in tokenize(text)]
        if self._is_spelling(tokens, text):
            return tokens
        marked = [int(token) for token in tokenize(b"\n" + text)]
        for skip in (1, 2):  # the newline's token, after a prefix space's if any
            head = marked[:skip]
            if self._is_spelling(head, b"\n") or self._is_spelling(head, b" \n"):
                rest = marked[skip:]
                return rest if self._is_spelling(rest, text) else []
        return []

    def _is_spelling(self, tokens: list[int], data: bytes) -> bool:
        """Whether ``tokens`` are vocabulary ids whose bytes join to exactly ``data``."""
        pieces = self.compiled.vocabulary.token_bytes
        if any(not 0 <= token < len(pieces) for token in tokens):
            return False
        return b"".join(pieces[token] for token in tokens) == data

    def _can_end_after(
        self, walked: list[tuple[frozenset[Stack], bool]], tokens: Sequence[int]
    ) -> bool:
        """Whether the grammar can end after ``tokens``, ``walked`` being :meth:`_walk`'s
        configurations before each (a cached step)."""
        if not tokens:
            return bool(self._can_end)
        step = self.compiled.advance(walked[-1][0], tokens[-1])
        return step is not None and bool(step[1])

    def _walk(self, tokens: Sequence[int]) -> list[tuple[frozenset[Stack], bool]] | None:
        """The configuration before each of ``tokens`` from here, or ``None`` if one is
        refused. The matcher's state does not change."""
        states = []
        stacks, can_end = self._stacks, self._can_end
        for token in tokens:
            states.append((stacks, can_end))
            step = self.compiled.advance(stacks, token)
            if step is None:
                return None
            stacks, can_end = step
        return states


def _utf8_prefix(data: bytes) -> str:
    for cut in range(len(data), max(len(data) - 4, -1), -1):
        try:
            return data[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return ""
