"""The vLLM (v1) logits processor: formline's masks for a whole persistent batch.

It needs vLLM's V1 model runner (``VLLM_USE_V2_MODEL_RUNNER=0`` where vLLM 0.32 picks V2, on
builds with a working Triton: V2 loads logits processors against another base class and
refuses this one at startup; docs/vllm.md). vLLM builds one :class:`FormlineLogitsProcessor`
in each worker's model runner (every tensor-parallel rank, every pipeline stage; the ranks of
the last stage sample, each from the same gathered logits), and the processor reads the
model's tokenizer there, at startup: a tokenizer formline cannot read stops vLLM's start
instead of every request's step.

It follows the batch through :meth:`update_state` (requests added, removed, moved between
rows) and keeps one :class:`~formline.mask.GrammarMatcher` per constrained row. At each
step :meth:`apply` lets every matcher accept the tokens its request gained since the last
step (the request's own ``output_token_ids`` list, which vLLM updates in place; with async
scheduling its placeholders ``-1`` are real ids by the time ``apply`` runs; a list vLLM
shortened, discarding tokens, is accepted again from its start), fills that row of one
``(max_num_seqs, words)`` int32 bitmask, and masks the constrained rows in place.
Unconstrained rows are not touched.

As formline's own backends do, a row whose grammar's shortest completion only just fits in
the tokens its budget leaves is closed on time: the completion's tokens are forced, one per
step (a small model looping on array items still ends with a complete value). The budget is
what vLLM allows: ``max_tokens``, and ``max_model_len`` less the prompt. With one token left
a row whose value may end is allowed only its end tokens. A closing that holds one of the
request's stop tokens is not forced (vLLM would stop on that token, mid-value).

A matcher that refuses a sampled token (another processor raised a masked logit, which
vLLM's built-in processors never do after this one) is logged and its row is closed: only
end-of-sequence stays allowed, so the request ends instead of the engine failing.

Set ``FORMLINE_VLLM_STATS=path`` to have the processor write its running totals there
(JSON: steps, constrained rows, seconds in ``apply``, and the sums of a per-row fit), at
most once a second and at exit: the benchmark reads the mask's cost from it.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from formline.backends.vllm.constraints import compiled_for, grammar_for, read_constraint
from formline.errors import FormlineError
from formline.mask.batch import default_batch_matcher
from formline.mask.bitmask import (
    allocate_token_bitmask,
    apply_token_bitmask_inplace,
    ids_to_bitmask,
)
from formline.mask.matcher import GrammarMatcher
from formline.vocab import Vocabulary, VocabularyError

if TYPE_CHECKING:
    from vllm.config import VllmConfig

log = logging.getLogger("formline.vllm")
STATS_ENV = "FORMLINE_VLLM_STATS"
STATS_INTERVAL_SECONDS = 1.0
# Closing texts whose tokens are kept: inside the closing window every step tokenizes the
# shortest completion, and the same few recur (the tokenizer's call was 2.5 of the 3.8 µs a
# row a step the closing policy cost on vLLM's extraction-dev outputs, replayed).
SPELLING_ENTRIES = 1024


@dataclass
class _Row:
    """A constrained request in the batch: its matcher and vLLM's list of its tokens."""

    matcher: GrammarMatcher | None  # None: the constraint did not compile here (closed)
    output: list[int]  # vLLM's running output_token_ids (a reference, updated in place)
    ends: np.ndarray  # the int32 words a closed row allows: its stop tokens, or the end ones
    budget: int | None = None  # the output tokens vLLM allows it (None: unknown)
    accepted: int = 0  # how many of them the matcher has accepted
    last_token: int = -1  # the last of them (a token vLLM replaced in place is noticed)
    closed: bool = False  # a refused token or a limit: only end-of-sequence is allowed now
    forced: list[int] = field(default_factory=list)  # the closing tokens still to write
    stop_ids: frozenset[int] = frozenset()  # vLLM's stop tokens for this request
    stop_words: np.ndarray | None = None  # the same, as a bitmask row (None: no stop token)
    not_eos_words: np.ndarray | None = None  # ~ the tokenizer's end tokens (made once)
    not_stop_words: np.ndarray | None = None  # ~ stop_words (made once, not per step)

    @property
    def remaining(self) -> int | None:
        """The tokens vLLM still lets this request write (``None``: no budget known)."""
        return None if self.budget is None else self.budget - self.accepted

    @property
    def live(self) -> GrammarMatcher:
        """The matcher of a row whose constraint compiled (every row not closed at its start)."""
        assert self.matcher is not None
        return self.matcher

    def catch_up(self) -> None:
        """Accept the tokens gained since the last step (up to a ``-1`` placeholder).

        Raises:
            FormlineError: a grammar limit met while accepting (the caller closes the row).
        """
        if self.matcher is not None and self._is_rewritten():
            self.restart()
        while self.accepted < len(self.output) and not self.closed:
            token = self.output[self.accepted]
            if token < 0:
                return
            if token in self.stop_ids:  # vLLM ends the request on it; nothing to check
                self.accepted += 1
                self.last_token = token
                continue
            if not self.live.is_terminated() and not self.live.accept_token(token):
                log.error(
                    "formline refused sampled token %d after %d tokens; the request is "
                    "ended (did another logits processor change masked logits?)",
                    token,
                    self.accepted,
                )
                self.closed = True
                return
            self.accepted += 1
            self.last_token = token
            if self.forced:
                self.forced = self.forced[1:] if token == self.forced[0] else []

    def _is_rewritten(self) -> bool:
        """Whether vLLM took back tokens this row accepted: the output is shorter, or the last
        accepted position holds another token (k tokens dropped and k new ones appended
        between two steps; only that position is compared, O(1) a step)."""
        if len(self.output) < self.accepted:
            return True
        return self.accepted > 0 and self.output[self.accepted - 1] != self.last_token

    def restart(self) -> None:
        """Start the matcher again, to accept the output from its first token: vLLM's V1
        runner shortens a request's ``output_token_ids`` in place, with no batch update, when
        it discards tokens (a failed KV load, async speculative decoding's optimistic ones),
        and a matcher that kept them would mask the next position after tokens that are gone.
        A row closed by a refused token opens again: that token may be one of those gone
        (met again, it closes the row again)."""
        log.warning(
            "vLLM shortened or rewrote a constrained request's output (%d tokens accepted, %d "
            "now); formline "
            "accepts it again from its start",
            self.accepted,
            len(self.output),
        )
        self.live.reset()
        self.accepted, self.last_token = 0, -1
        self.closed = False
        self.forced = []

    def close(self, error: Exception) -> None:
        """End the request (only its end tokens allowed from now): a grammar limit met while
        decoding, which raised out of vLLM's step would stop the engine and every request."""
        log.error(
            "formline ended a request after %d tokens: %s: %s",
            self.accepted,
            type(error).__name__,
            error,
        )
        self.closed = True

    def end_with_stop_tokens(self, words: np.ndarray) -> None:
        """Where the grammar may end, allow the request's own stop tokens in place of the
        tokenizer's end tokens: SmolLM2's tokenizer ends on ``<|endoftext|>`` (0) and
        ``<|im_end|>`` (2), vLLM stops on 2 only, and a 0 sampled there ran the request on
        to ``max_tokens`` (3 of 72 extraction-dev answers, each complete but "length").
        Elsewhere no stop token is allowed, and a row left with no token is ended."""
        if self.stop_words is None:
            return
        # A stop token is never the grammar's text: vLLM ends the request on it, and a '.'
        # in stop_token_ids cut [0-9]+\.[0-9]+ to "18", answered "stop".
        words &= self.not_stop_words
        if self.live.can_end():
            words &= self.not_eos_words
            words |= self.stop_words
        elif not words.any():
            self.close(ValueError("stop_token_ids hold every token the grammar allows"))
            words[:] = self.ends

    def must_end_now(self) -> bool:
        """Whether only the end tokens may come next: the value may end and one token is
        left. Any other token would be vLLM's last, and most (a number's ``.``) leave a value
        that cannot end ("111." answered "length")."""
        remaining = self.remaining
        return remaining is not None and remaining <= 1 and self.live.can_end()

    def plan_closing(self, tokenize: Callable[[bytes], list[int]]) -> bool:
        """Whether the closing tokens must start now (then they are in :attr:`forced`,
        accepted as vLLM samples them, one per step).

        Raises:
            FormlineError: a grammar limit met by the closing's search.
        """
        remaining = self.remaining
        if remaining is None or self.live.is_terminated():
            return False
        forced = self.live.closing_tokens(remaining, tokenize)
        if self.stop_ids.intersection(forced):
            # vLLM would end the request on that token, mid-value, and answer "stop". Not
            # forced, the row goes on under its mask (which holds no stop token inside the
            # value) and ends at its budget, answered "length", as it is.
            forced = []
        self.forced = forced
        return bool(forced)


class FormlineLogitsProcessor(LogitsProcessor):
    """Grammar-constrained decoding for the vLLM requests that ask for it (see
    :mod:`formline.backends.vllm.constraints` for the ``vllm_xargs`` keys).

    Raises (from :meth:`validate_params`, in vLLM's API process):
        ValueError: the request's constraint is malformed or does not compile, or it comes
            with a sampling parameter that would cut or empty its mask; vLLM turns it into a
            400 naming the key or the parameter.
    Raises (from the constructor, at vLLM's startup):
        VocabularyError: a tokenizer formline cannot read.
    Costs: the vocabulary is built at construction (about 0.1 s for 49k tokens, 0.15 s for
    151k); per step, one accept and one cached mask lookup per constrained row plus one
    vectorised apply over those rows.
    """

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """Check a request's constraint and its other sampling parameters (vLLM's API
        process, before the request is queued).

        Raises:
            ValueError: a malformed or non-compiling constraint, or a constraint with
                ``stop``, ``min_tokens``, ``bad_words`` or ``allowed_token_ids``.
        Costs milliseconds for most constraints; seconds for a hostile schema (docs/vllm.md).
        """
        constraint = read_constraint(sampling_params.extra_args)
        if constraint is None:
            return
        # vLLM applies these outside the logits: a stop string cuts the constrained text
        # wherever it appears ('}' inside a value, a newline) and answers "stop"; min_tokens
        # masks the end tokens when the grammar allows nothing else. Refused, as formline's
        # own server refuses stop strings, rather than a broken value called complete.
        if sampling_params.stop:
            raise ValueError(
                "stop strings cannot be used with a formline constraint: vLLM would cut its "
                "output wherever one appears, leaving it invalid (the grammar ends it)"
            )
        if sampling_params.min_tokens:
            raise ValueError(
                "min_tokens cannot be used with a formline constraint: where the grammar "
                "allows only the end, it would leave no token to sample"
            )
        # vLLM removes these tokens before formline's mask: where the grammar allows only
        # removed ones, no token is left, and vLLM samples one anyway (an invalid value it
        # reports as complete).
        if sampling_params.bad_words:
            raise ValueError(
                "bad_words cannot be used with a formline constraint: where the grammar "
                "allows only those words' tokens, no token would be left to sample"
            )
        if sampling_params.allowed_token_ids:
            raise ValueError(
                "allowed_token_ids cannot be used with a formline constraint: where the "
                "grammar allows none of them, no token would be left to sample (the grammar "
                "chooses the tokens)"
            )
        grammar_for(constraint)

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool):
        """Read the model's tokenizer into a formline vocabulary (vLLM builds the processor
        at startup, in each worker).

        Raises:
            VocabularyError: a tokenizer formline cannot read (neither byte-level BPE nor
                SentencePiece) or one larger than the model's logits. Raised here, vLLM does
                not start; met at the first constrained request, it stopped vLLM's engine
                step, and every request in it, at each such request.
        """
        self.model_config = vllm_config.model_config
        self.device = device
        self.max_rows = int(vllm_config.scheduler_config.max_num_seqs)
        # vLLM ends a request when its prompt and output reach this (FINISHED_LENGTH_CAPPED),
        # whatever its max_tokens: the closing's budget.
        self.max_model_len = int(self.model_config.max_model_len)
        self.rows: dict[int, _Row] = {}
        self._spellings: dict[bytes, tuple[int, ...]] = {}
        size = int(self.model_config.get_vocab_size())  # the logits' width
        self.vocabulary, self._tokenizer = self._read_vocabulary(size)
        self._bitmask = allocate_token_bitmask(self.max_rows, size)
        eos = np.array(sorted(self.vocabulary.eos_ids))
        # The tokenizer's end tokens, as a row.
        self._end_words = ids_to_bitmask(eos, self._bitmask.shape[1]).view(np.int32)
        # Sums for a least-squares fit of seconds = fixed + per_row * rows (the benchmark's).
        self.stats = {"steps": 0, "rows": 0, "seconds": 0.0, "rows_squared": 0, "rows_seconds": 0.0}
        self._stats_path = os.environ.get(STATS_ENV)
        self._stats_written = 0.0
        if self._stats_path:
            atexit.register(self._write_stats)

    def is_argmax_invariant(self) -> bool:
        """A mask changes the argmax."""
        return False

    def _read_vocabulary(self, size: int) -> tuple[Vocabulary, Any]:
        """The model's tokenizer as a formline vocabulary of ``size`` tokens (the logits'), and
        the tokenizer (it spells closing texts).

        Raises:
            VocabularyError: as the constructor; the message names the tokenizer and says
                what to do.
        """
        from transformers import AutoTokenizer

        config = self.model_config
        tokenizer = AutoTokenizer.from_pretrained(
            config.tokenizer,
            revision=config.tokenizer_revision,
            trust_remote_code=config.trust_remote_code,
        )
        try:
            vocabulary = Vocabulary.from_huggingface(tokenizer, size)
        except VocabularyError as error:
            raise VocabularyError(
                f"formline's vLLM logits processor cannot read the tokenizer of "
                f"{config.tokenizer}: {error}. Serve this model without "
                f"--logits-processors formline.backends.vllm:FormlineLogitsProcessor"
            ) from error
        return vocabulary, tokenizer

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Follow the batch: removed, then added, then moved rows (vLLM's order)."""
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, params, prompt, output in batch_update.added:
            row = self._new_row(params, prompt, output)
            if row is None:
                self.rows.pop(index, None)
            else:
                self.rows[index] = row
        for first, second, direction in batch_update.moved:
            row_first, row_second = self.rows.pop(first, None), self.rows.pop(second, None)
            if row_first is not None:
                self.rows[second] = row_first
            if row_second is not None and direction == MoveDirectionality.SWAP:
                self.rows[first] = row_second

    def _new_row(
        self, params: SamplingParams, prompt: list[int] | None, output: list[int]
    ) -> _Row | None:
        """The row of a request added to the batch (``None``: it asks for no constraint).
        A constraint that does not compile here gives a closed row: raised, it would stop
        vLLM's engine step and every request in it."""
        constraint = read_constraint(params.extra_args)
        if constraint is None:
            return None
        stop_ids = frozenset(params.all_stop_token_ids or ())
        stop_words = None
        if stop_ids:
            words = ids_to_bitmask(np.array(sorted(stop_ids)), self._bitmask.shape[1])
            stop_words = words.view(np.int32)
        try:
            compiled = compiled_for(constraint, self.vocabulary)
        except ValueError as error:  # validate_params built it; here it did not (a limit)
            failed = _Row(None, output, self._end_words if stop_words is None else stop_words)
            failed.close(error)
            return failed
        eos_words = compiled.eos_mask.view(np.int32)
        row = _Row(
            GrammarMatcher(compiled), output, eos_words if stop_words is None else stop_words
        )
        row.budget = self._budget(params, prompt)
        row.stop_ids, row.stop_words = stop_ids, stop_words
        if stop_words is not None:
            row.not_eos_words, row.not_stop_words = ~eos_words, ~stop_words
        return row

    def _budget(self, params: SamplingParams, prompt: list[int] | None) -> int | None:
        """The output tokens vLLM allows a request: its ``max_tokens``, and what
        ``max_model_len`` leaves after its prompt (vLLM's OpenAI server caps ``max_tokens``
        by it; the offline ``LLM`` does not, and vLLM still ends the request there). ``None``
        when neither is known (a prompt given as embeddings, and no ``max_tokens``)."""
        room = None if prompt is None else self.max_model_len - len(prompt)
        if params.max_tokens is None:
            return room
        return params.max_tokens if room is None else min(params.max_tokens, room)

    def _tokenize(self, text: bytes) -> list[int]:
        known = self._spellings.get(text)
        if known is None:
            known = tuple(  # special tokens' texts stay text, as in the other backends
                self._tokenizer.encode(
                    text.decode("utf-8", errors="replace"),
                    add_special_tokens=False,
                    split_special_tokens=True,
                )
            )
            if len(self._spellings) >= SPELLING_ENTRIES:
                self._spellings.clear()
            self._spellings[text] = known
        return list(known)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Mask the constrained rows of ``logits`` (``(batch, vocab)``) in place."""
        if not self.rows:
            return logits
        started = time.perf_counter()
        bitmask = self._bitmask
        indices = sorted(index for index in self.rows if index < logits.shape[0])
        filled: list[int] = []
        for index in indices:
            row = self.rows[index]
            is_forced = ends_now = False
            try:
                row.catch_up()
                ends_now = not row.closed and row.must_end_now()
                is_forced = (
                    not row.closed
                    and not ends_now
                    and bool(row.forced or row.plan_closing(self._tokenize))
                )
            except FormlineError as error:  # a state or stack limit, met by a step
                row.close(error)
            if row.closed or ends_now:
                bitmask[index] = row.ends
            elif is_forced:
                forced = ids_to_bitmask(np.array(row.forced[:1]), bitmask.shape[1])
                bitmask[index] = forced.view(np.int32)
            else:
                filled.append(index)
        self._fill(filled, bitmask)
        apply_token_bitmask_inplace(logits, bitmask, indices=indices)
        self._count(len(indices), time.perf_counter() - started)
        return logits

    def _fill(self, filled: list[int], bitmask: np.ndarray) -> None:
        """The masks of rows ``filled`` into ``bitmask``, on the thread pool (new states'
        walks run without the GIL). A walk past a limit is found row by row, and its row
        closed: the others keep their masks."""
        matchers = [self.rows[index].live for index in filled]
        try:
            default_batch_matcher().batch_fill_next_token_bitmask(matchers, bitmask, filled)
        except FormlineError:
            for index, matcher in zip(filled, matchers, strict=True):
                try:
                    matcher.fill_next_token_bitmask(bitmask, index)
                except FormlineError as error:
                    self.rows[index].close(error)
                    bitmask[index] = self.rows[index].ends
        for index in filled:
            if not self.rows[index].closed:
                self.rows[index].end_with_stop_tokens(bitmask[index])

    def _count(self, rows: int, seconds: float) -> None:
        self.stats["steps"] += 1
        self.stats["rows"] += rows
        self.stats["seconds"] += seconds
        self.stats["rows_squared"] += rows * rows
        self.stats["rows_seconds"] += rows * seconds
        if self._stats_path and time.monotonic() - self._stats_written > STATS_INTERVAL_SECONDS:
            self._write_stats()

    def _write_stats(self) -> None:
        if not self._stats_path:
            return
        self._stats_written = time.monotonic()
        path = Path(self._stats_path)
        partial = path.with_name(path.name + ".partial")
        partial.write_text(json.dumps({**self.stats, "pid": os.getpid()}))
        partial.replace(path)
