"""The decoding loop: the one place where a model's steps are driven, for every engine.

:func:`decode` runs a prompt through an engine (:class:`~formline.backends.base.Backend`:
``tokenize_prompt``, ``tokenize``, ``reset``, ``forward``) under an optional matcher: a
forward pass, the mask (``fill_next_token_bitmask`` then ``apply_token_bitmask_inplace``),
a token (greedy, or temperature and top-p from ``numpy.random.default_rng(seed)``), its
accept, until a stop token, the grammar's end or ``max_tokens``. The matcher's policies
decide the rest: the text the grammar forces (``jump_forward_tokens``) is fed with the
sampled token in one pass, the opening forced text shares the prompt's pass, the grammar's
end finishes without another pass, and a completion that only just fits the budget
(``closing_tokens``) is written instead of running into ``max_tokens``. What watches the
loop (pressure, traces, streaming, deadlines) is a :class:`StepListener`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from formline.backends.base import Backend, BackendError
from formline.mask.bitmask import allocate_token_bitmask, apply_token_bitmask_inplace
from formline.mask.matcher import CLOSING_WINDOW_TOKENS, GrammarMatcher
from formline.pipeline.listeners import Deadline, StepListener, TokenFeed
from formline.pipeline.pressure import PressureListener


@dataclass(frozen=True)
class Sampling:
    """Decoding settings. ``temperature == 0`` is greedy; a ``seed`` makes sampling
    reproducible. ``close_within_budget``: when the shortest text that completes the grammar
    only just fits in the tokens left, write it instead of running into ``max_tokens`` (a
    small model looping on array items still returns a complete, valid value; ``usage``
    counts the closing tokens).

    ``deadline`` (a ``time.monotonic()`` value) and ``on_tokens`` are shorthands for the
    :class:`~formline.pipeline.listeners.Deadline` and
    :class:`~formline.pipeline.listeners.TokenFeed` listeners: the loop stops at the first
    step past the deadline (finish_reason ``"timeout"``), and ``on_tokens`` gets the tokens
    added at each step (returning ``False`` stops it with ``"cancelled"``)."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int = 256
    jump_forward: bool = True
    close_within_budget: bool = True
    deadline: float | None = None
    on_tokens: Callable[[list[int]], bool | None] | None = None


@dataclass
class Generation:
    """What one decoding loop produced, and what it cost. ``token_ids`` are the output's
    tokens without the stop token; ``completion_tokens`` counts them."""

    token_ids: list[int]
    text: str
    # "stop" (a stop token or the grammar's end), "length" (max_tokens), "timeout" (past
    # Sampling.deadline) or "cancelled" (Sampling.on_tokens said stop)
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    forward_passes: int = 0
    forward_passes_saved: int = 0  # tokens fed by jump-forward beyond one per pass
    closing_tokens: int = 0  # tokens of a completion written to fit max_tokens
    # Per sampled output position: (probability mass the mask removed, whether the model's
    # preferred token was refused, that token's id). Forced and closing tokens have no entry.
    step_pressure: dict[int, tuple[float, bool, int]] = field(default_factory=dict)
    # Per sampled position: the chosen token's unmasked probability (PressureListener).
    step_confidence: dict[int, float] = field(default_factory=dict)
    forward_seconds: float = 0.0
    mask_seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def decode(
    engine: Backend,
    prompt: str,
    matcher: GrammarMatcher | None,
    sampling: Sampling,
    listeners: Sequence[StepListener] = (),
) -> Generation:
    """Decode from ``prompt`` (already rendered: see ``engine.render_chat``), constrained
    by ``matcher`` when given, free otherwise.

    Raises:
        BackendError: the prompt has no tokens or does not fit the engine's context, the
            engine fails, or this thread is already decoding on ``engine`` (another
            thread's decode on it is waited for: an engine holds one sequence).
        RuntimeError: the matcher refuses a token its own mask allowed, or allows none
            (both formline bugs).
    Costs one forward pass per sampled token plus, constrained, a mask, its pressure and an
    accept (about 0.1-0.3 ms with SmolLM2's 49k tokens); jump-forward feeds the forced
    tokens in the sampled token's pass (on a CPU a pass of k tokens costs nearly k single
    passes, so it saves passes more than time).
    """
    with _engine_turn(engine):
        return _decode(engine, prompt, matcher, sampling, listeners)


class _Turn:
    """One engine's turn to decode: its lock and the thread that holds it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.owner: int | None = None


_turns: dict[int, _Turn] = {}  # by id(engine); an engine's entry lives as long as the process
_turns_lock = threading.Lock()


@contextmanager
def _engine_turn(engine: Backend) -> Iterator[None]:
    """Hold ``engine`` for one sequence: an engine holds one sequence's state (``reset``,
    then ``forward`` appends), so a second decode on it waits for the first. Two at once
    (``formline.generate`` inside a ``formline.stream`` loop, whose decode runs on a worker
    thread) crashed the process in llama.cpp (a segmentation fault or an abort).

    Raises:
        BackendError: this thread is already decoding on ``engine`` (a listener or an
            ``on_tokens`` callback that decodes on the same engine would wait for ever).
    """
    with _turns_lock:
        turn = _turns.setdefault(id(engine), _Turn())
    if turn.owner == threading.get_ident():
        raise BackendError(
            "this engine is already decoding on this thread (a listener or on_tokens "
            "callback decoded on it): an engine decodes one sequence at a time"
        )
    with turn.lock:
        turn.owner = threading.get_ident()
        try:
            yield
        finally:
            turn.owner = None


def _decode(
    engine: Backend,
    prompt: str,
    matcher: GrammarMatcher | None,
    sampling: Sampling,
    listeners: Sequence[StepListener],
) -> Generation:
    started = time.perf_counter()
    prompt_ids = engine.tokenize_prompt(prompt)
    if not prompt_ids:  # transformers' forward of no tokens raised a bare RuntimeError
        raise BackendError("the prompt has no tokens: give it some text (or a bos token)")
    if len(prompt_ids) >= engine.context_size:
        raise BackendError(
            f"the prompt has {len(prompt_ids)} tokens; n_ctx is {engine.context_size}"
        )
    watchers = list(listeners)
    if sampling.on_tokens is not None:
        watchers.append(TokenFeed(sampling.on_tokens))
    if sampling.deadline is not None:
        watchers.append(Deadline(sampling.deadline))
    pressure = PressureListener()
    room = engine.context_size - len(prompt_ids)
    if sampling.max_tokens > room:  # the context ends first: close within it, not past it
        sampling = replace(sampling, max_tokens=room)
    loop = _Loop(engine, matcher, sampling, [pressure, *watchers])
    finish = loop.run(prompt_ids)
    loop.notify_output()  # the last tokens reach a streaming listener too
    special = engine.vocabulary.special_ids
    pieces = engine.vocabulary.token_bytes
    data = b"".join(pieces[token] for token in loop.output if token not in special)
    return Generation(
        token_ids=loop.output,
        text=data.decode("utf-8", errors="replace"),
        finish_reason=finish,
        prompt_tokens=len(prompt_ids),
        completion_tokens=len(loop.output),
        forward_passes=loop.forward_passes,
        forward_passes_saved=loop.forced_tokens,
        closing_tokens=loop.closing_tokens,
        step_pressure=pressure.steps,
        step_confidence=pressure.chosen,
        forward_seconds=loop.forward_seconds,
        mask_seconds=loop.mask_seconds,
        extra={
            "jump_forward_tokens": loop.forced_tokens,
            "prompt_seconds": loop.prompt_seconds,
            "total_seconds": time.perf_counter() - started,
        },
    )


class _Loop:
    """One decoding loop's state and counters (see :func:`decode`)."""

    def __init__(
        self,
        engine: Backend,
        matcher: GrammarMatcher | None,
        sampling: Sampling,
        listeners: list[StepListener],
    ):
        self.engine, self.matcher, self.sampling = engine, matcher, sampling
        self.listeners = listeners
        # The listeners that may lower the budget, found once (most loops have none).
        self.budget_listeners = [
            listener
            for listener in listeners
            if type(listener).max_tokens is not StepListener.max_tokens
        ]
        self.rng = np.random.default_rng(sampling.seed)
        self.stop_ids = engine.vocabulary.eos_ids
        self.output: list[int] = []
        self.fed = 0  # tokens in the engine's context
        self.forward_passes = self.forced_tokens = self.closing_tokens = 0
        self.forward_seconds = self.prompt_seconds = self.mask_seconds = 0.0
        self.last_forward = 0.0
        size = engine.vocabulary.size
        self.bitmask = allocate_token_bitmask(1, size) if matcher is not None else None

    def run(self, prompt_ids: list[int]) -> str:
        """The step loop; fills :attr:`output` and returns the finish reason."""
        matcher, sampling = self.matcher, self.sampling  # sampling's budget: self.sampling's
        # A grammar can force its opening bytes ('{"name":"'): they share the prompt's pass.
        self.output = self.forced(sampling.max_tokens, len(prompt_ids))
        if sampling.deadline is not None and time.monotonic() > sampling.deadline:
            # Past it already (a server's later choice of n): no prompt pass, which can take
            # seconds on a CPU, for an answer that would be a timeout after it.
            return "timeout"
        for listener in self.listeners:
            listener.on_start(len(prompt_ids))
        # Each step's output is shown before its pass, not after it: a server request whose
        # client left while it waited for the model ran its whole prompt pass first.
        stopped = self.notify_output()
        if stopped:
            return stopped
        self.engine.reset()
        self.fed = 0
        logits = self.forward(prompt_ids + self.output)
        self.prompt_seconds = self.forward_seconds
        if matcher is not None and self.output and matcher.is_only_stop_allowed():
            return "stop"  # the grammar forced all of its text
        while len(self.output) < self.sampling.max_tokens and self.fed < self.engine.context_size:
            if self.mask(logits) and self.close():
                return "stop"
            token = self.choose(logits)
            if token in self.stop_ids or (matcher is not None and matcher.is_terminated()):
                return "stop"
            if self.closes_instead(token):
                return "stop"
            self.output.append(token)
            self.lower_budget()
            if matcher is not None and matcher.is_only_stop_allowed():
                return "stop"
            forced = self.forced(self.sampling.max_tokens - len(self.output), self.fed + 1)
            self.output.extend(forced)
            if forced and matcher is not None and matcher.is_only_stop_allowed():
                return "stop"
            if len(self.output) >= self.sampling.max_tokens:
                break  # no pass for logits nobody will read
            stopped = self.notify_output()
            if stopped:
                return stopped
            logits = self.forward([token, *forced])
        return "length"

    def notify_output(self) -> str | None:
        """Show the output to every listener; the first finish reason one of them gives."""
        reasons = [listener.on_output(self.output) for listener in self.listeners]
        return next((reason for reason in reasons if reason), None)

    def lower_budget(self) -> None:
        """Take a listener's lower budget (:meth:`StepListener.max_tokens`) as the loop's,
        right after a token is accepted: the step's forced tokens and the closing policy
        then keep to it (read after them, a formline_think answer's forced tokens ran past
        its own max_tokens)."""
        budgets = [
            budget for listener in self.budget_listeners if (budget := listener.max_tokens())
        ]
        if budgets and min(budgets) < self.sampling.max_tokens:
            self.sampling = replace(self.sampling, max_tokens=max(min(budgets), len(self.output)))

    def forward(self, tokens: list[int]) -> np.ndarray:
        begun = time.perf_counter()
        logits = self.engine.forward(tokens)
        self.last_forward = time.perf_counter() - begun
        self.forward_seconds += self.last_forward
        self.forward_passes += 1
        self.fed += len(tokens)
        return logits

    def mask(self, logits: np.ndarray) -> bool:
        """Mask ``logits`` in place (listeners see them before and after; their time counts
        as the mask's, as the pressure is part of it); whether there is a matcher."""
        position, begun = len(self.output), time.perf_counter()
        for listener in self.listeners:
            listener.on_logits(position, logits, self.matcher, self.last_forward)
        if self.matcher is None or self.bitmask is None:
            return False
        self.matcher.fill_next_token_bitmask(self.bitmask)
        apply_token_bitmask_inplace(logits, self.bitmask[0])
        for listener in self.listeners:
            listener.on_masked(position, logits, self.bitmask[0])
        self.mask_seconds += time.perf_counter() - begun
        return True

    def close(self) -> bool:
        """Write the shortest completion when it only just fits (a margin early), for a
        matcher that cannot take a token back; whether it did. One that can does not close
        here: :meth:`closes_instead` lets the model choose first and replaces its token only
        when the completion would no longer fit after it (closing here, two tokens early,
        ``{"age":36}`` under max_tokens 6-7 came out ``{"age":0}``: an answer that fitted,
        overwritten and reported as the model's)."""
        matcher = self.matcher
        if matcher is None or not self.sampling.close_within_budget or self._can_roll_back(1):
            return False
        remaining = self.sampling.max_tokens - len(self.output)
        closing = matcher.closing_tokens(remaining, self.engine.tokenize)
        if not closing or not matcher.accept_tokens(closing):
            return False
        self.output.extend(closing)
        self.closing_tokens = len(closing)
        return True

    def choose(self, logits: np.ndarray) -> int:
        """Pick the next token and (when constrained) accept it."""
        token = choose_token(logits, self.sampling.temperature, self.sampling.top_p, self.rng)
        for listener in self.listeners:
            listener.on_token(len(self.output), token, self.matcher)
        if self.matcher is not None and not self.matcher.accept_token(token):
            piece = self.engine.vocabulary.token_bytes[token]
            raise RuntimeError(
                f"formline bug: the matcher refused token {token} ({piece!r}) that its own "
                "mask allowed"
            )
        return token

    def forced(self, budget: int, fed_after: int) -> list[int]:
        """The forced tokens to feed next (accepted), within ``budget`` tokens and the
        context left after ``fed_after`` tokens; ``[]`` without jump-forward."""
        matcher = self.matcher
        if matcher is None or not self.sampling.jump_forward:
            return []
        room = min(budget, self.engine.context_size - fed_after - 1)
        tokens = matcher.jump_forward_tokens(self.engine.tokenize, room)
        if not tokens or not matcher.accept_tokens(tokens):
            return []
        if (
            self.sampling.close_within_budget
            and self._can_roll_back(len(tokens))
            and not self._still_closable(budget - len(tokens))
        ):
            matcher.rollback(len(tokens))  # sampled instead: the next step can still close
            return []
        self.forced_tokens += len(tokens)
        return tokens

    def closes_instead(self, token: int) -> bool:
        """Whether ``token`` (accepted) would leave too few tokens for the shortest
        completion, so it was taken back and the completion written instead. One token can
        lengthen the completion by many: on invoice-10 a ``},`` with 19 tokens left turned a
        6-token completion (``}],"total":0}``) into a 19-token one (another item's required
        fields), and the answer ran into max_tokens. Costs one search per step in the last
        CLOSING_WINDOW_TOKENS."""
        matcher, sampling = self.matcher, self.sampling
        if matcher is None or not sampling.close_within_budget or not self._can_roll_back(1):
            return False
        if self._still_closable(sampling.max_tokens - len(self.output) - 1):
            return False
        matcher.rollback(1)
        completion = matcher.completion_tokens(self.engine.tokenize)
        room = sampling.max_tokens - len(self.output)
        if not completion or len(completion) > room or not matcher.accept_tokens(completion):
            matcher.accept_token(token)  # nothing better: keep the model's token
            return False
        self.output.extend(completion)
        self.closing_tokens = len(completion)
        return True

    def _can_roll_back(self, count: int) -> bool:
        """Whether the matcher can undo ``count`` tokens (a server may cap its history)."""
        limit = getattr(self.matcher, "max_rollback_tokens", None)
        return limit is None or limit >= count

    def _still_closable(self, left: int) -> bool:
        """Whether, with ``left`` tokens after the tokens just accepted, the shortest
        completion still fits. A forced key (``"unit_price": ``) spends several tokens in
        one step: on invoice-10 it jumped past the last step at which the array could still
        be closed, and the answer ran into max_tokens (a cut-off in 1 of 72). No margin:
        the caller takes the tokens back when it does not fit, and every step checks again,
        so the completion that fitted before them is still there to write (with a 2-token
        margin, answers that fitted exactly were overwritten)."""
        if left > CLOSING_WINDOW_TOKENS:
            return True
        assert self.matcher is not None
        completion = self.matcher.completion_tokens(self.engine.tokenize)
        return completion is not None and len(completion) <= left


NUCLEUS_CANDIDATES = 256  # tokens sorted first for a top-p nucleus (most nuclei hold fewer)


def choose_token(
    logits: np.ndarray, temperature: float, top_p: float, rng: np.random.Generator
) -> int:
    """The next token: argmax when ``temperature <= 0``, else a draw from the softmax of
    ``logits / temperature`` cut to the smallest top-``top_p`` nucleus.

    Raises:
        RuntimeError: no token has a finite logit (a mask that allows nothing).
    Costs O(V) for greedy; sampling with ``top_p < 1`` adds a partial selection of the
    :data:`NUCLEUS_CANDIDATES` likeliest tokens and their sort, and a sort of every allowed
    token only when those do not hold the nucleus.
    """
    if temperature <= 0:
        token = int(np.argmax(logits))
        if not np.isfinite(logits[token]):
            raise RuntimeError("formline bug: no token has a finite logit (the mask allows none)")
        return token
    ids = np.flatnonzero(np.isfinite(logits))
    if ids.size == 0:
        raise RuntimeError("formline bug: no token has a finite logit (the mask allows none)")
    allowed = logits[ids].astype(np.float64)
    # Centred before the division: logits / 5e-324 overflowed to inf, inf - inf is NaN,
    # and a NaN softmax drew "ectableectable..."; centred, a tiny temperature is greedy
    # (the others' -inf is their probability 0, not an overflow to warn of).
    with np.errstate(over="ignore"):
        probs = np.exp((allowed - allowed.max()) / temperature)
    probs /= probs.sum()
    if top_p < 1.0:
        order = _nucleus_order(probs, top_p)
        cut = int(np.searchsorted(np.cumsum(probs[order]), top_p)) + 1
        ids, probs = ids[order[:cut]], probs[order[:cut]]
    cumulative = np.cumsum(probs)
    pick = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return int(ids[min(pick, ids.size - 1)])


def _nucleus_order(probs: np.ndarray, top_p: float) -> np.ndarray:
    """The positions of ``probs`` by decreasing probability, ties by position (a stable
    sort's order), far enough to hold the top-``top_p`` nucleus: the likeliest
    :data:`NUCLEUS_CANDIDATES` (then 16 times as many), sorted, when they hold it, else every
    token sorted. A draw over 49,152 allowed tokens: 0.6-1.4 ms, against 4.7-4.8 with a sort
    of them all (``python -m bench.policy_bench``, bench/results/policy.md)."""
    for count in (NUCLEUS_CANDIDATES, 16 * NUCLEUS_CANDIDATES):
        if probs.size <= 2 * count:
            break
        threshold = np.partition(probs, probs.size - count)[-count]
        # Every token as likely as the threshold is kept, so ties sort as in a full sort.
        candidates = np.flatnonzero(probs >= threshold)
        order = candidates[np.lexsort((candidates, -probs[candidates]))]
        if np.cumsum(probs[order])[-1] >= top_p:  # the nucleus is among them, in order
            return order
    return np.argsort(-probs, kind="stable")
