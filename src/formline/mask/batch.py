"""Masks of a whole batch at once: new states walked on a thread pool without the GIL.

XGrammar's ``BatchGrammarMatcher`` and llguidance's parallel fill in one shape. Rows whose
mask is cached are copied at once (natively, GIL released). For the others, the automaton
states their masks still need are collected, each state once, and walked on the pool (the
kernel's trie walks release the GIL); then those rows are filled from the walks.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from formline.mask.bitmask import words_for
from formline.mask.compiled import DEFER_TO_MATE, WAIT_FOR_MATE, WALK_NOW
from formline.mask.matcher import GrammarMatcher
from formline.native import copy_masks

# Rows a thread must have to be worth a hand-off: a submit to the pool and its result cost
# 82 µs on this 2-core machine (an empty task, timed over 2,000), six or seven rows' masks.
MASKS_PER_THREAD = 8


class BatchGrammarMatcher:
    """Fills and advances many matchers per step.

    Args:
        max_threads: worker threads (default: the CPUs this process may use).
    """

    def __init__(self, max_threads: int | None = None):
        available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        self.max_threads = max(1, max_threads or available or os.cpu_count() or 1)
        self._pool = ThreadPoolExecutor(self.max_threads, thread_name_prefix="formline-mask")

    def batch_fill_next_token_bitmask(
        self,
        matchers: Sequence[GrammarMatcher],
        bitmask: Any,
        indices: Sequence[int] | None = None,
    ) -> None:
        """Write ``matchers[k]``'s mask into row ``indices[k]`` (default ``k``) of ``bitmask``,
        an int32 ``(batch, words)`` numpy array or torch tensor (a CPU tensor is written in
        place; another device gets one copy of the filled rows).

        Raises:
            ValueError: ``indices`` and ``matchers`` differ in length, or a row is out of range.
            ParserLimitError: a matcher's walk needed more stacks than its limit.
        Costs one cached lookup and one row copy per matcher, or the mask's walk when new.
        """
        rows = (
            np.arange(len(matchers), dtype=np.int64)
            if indices is None
            else np.asarray(indices, dtype=np.int64)
        )
        if len(rows) != len(matchers):
            raise ValueError(f"{len(matchers)} matchers but {len(rows)} indices")
        target, device_tensor = _numpy_target(bitmask)
        if len(rows) and (rows.min() < 0 or rows.max() >= target.shape[0]):
            raise ValueError(f"a row index is outside the bitmask's {target.shape[0]} rows")
        needed = max((words_for(m.compiled.vocabulary_size) for m in matchers), default=0)
        if target.shape[1] < needed:
            raise ValueError(
                f"the bitmask's rows have {target.shape[1]} words; the vocabulary needs {needed}"
            )
        # Cached rows are copied in one native call (a hand-off to a thread costs more than a
        # 16 KiB copy); only the new states' walks go to the pool.
        found: list[np.ndarray] = []
        hits: list[int] = []
        misses: list[int] = []
        for position, matcher in enumerate(matchers):
            words = matcher.cached_mask_words()
            if words is None:
                misses.append(position)
            else:
                found.append(words)
                hits.append(position)
        copy_masks(found, target, rows[hits])
        if misses:
            missed = [matchers[k] for k in misses]
            self._walk_new_states(missed)
            copy_masks(self._compute_masks(missed), target, rows[misses])
        if device_tensor is not None:
            torch = sys.modules["torch"]
            device_tensor.copy_(torch.from_numpy(target))

    def _walk_new_states(self, matchers: Sequence[GrammarMatcher]) -> None:
        """Spread the states the rows need walked over the threads, each state once (rows
        in one state would otherwise wait for each other's walk in lockstep)."""
        work: dict[int, tuple[Any, set[int]]] = {}
        for matcher in matchers:
            states = matcher.unwalked_states()
            if states:
                work.setdefault(id(matcher.compiled), (matcher.compiled, set()))[1].update(states)
        tasks = [(compiled, state) for compiled, states in work.values() for state in states]
        # Longest first: a walk costs about the trie nodes its first bytes open, so states
        # that read many bytes (inside a string) go before those that read one (a key).
        tasks.sort(key=lambda task: -task[0].live_byte_count(task[1]))
        threads = min(self.max_threads, len(tasks))
        if threads == 1:
            for compiled, state in tasks:
                compiled.walk_state_scheduled(state, WALK_NOW)
            return
        # One shared queue (a deque's popleft and append are atomic under the GIL): each
        # thread takes the next state when it is done with one. Dealt out in fixed slices, the
        # 1 to 3 ms walks of string states met on one thread and 2 threads gave 1.25x on 29
        # states; taken together, two string states of one shape were both walked in full
        # (0.7 ms each on Llama-3) where the second, after the first, reuses it (0.2-0.3 ms).
        pending = deque(tasks)
        futures = [self._pool.submit(_walk, pending) for _ in range(threads - 1)]
        _walk(pending)  # this thread walks too
        for future in futures:
            future.result()

    def _compute_masks(self, matchers: Sequence[GrammarMatcher]) -> list[np.ndarray]:
        """The rows' masks once their states are walked: each an OR of walks plus escape
        checks, about 12 µs a row on Llama-3 (kernel.fill releases the GIL), shared out over
        the threads when there are enough rows to pay for the hand-off."""
        threads = min(self.max_threads, len(matchers) // MASKS_PER_THREAD)
        if threads <= 1:
            return [matcher.next_token_mask_words() for matcher in matchers]
        pending = deque(matchers)
        futures = [self._pool.submit(_compute, pending) for _ in range(threads - 1)]
        _compute(pending)
        for future in futures:
            future.result()
        return [matcher.next_token_mask_words() for matcher in matchers]  # cached now

    def batch_accept_token(
        self, matchers: Sequence[GrammarMatcher], token_ids: Sequence[int]
    ) -> list[bool]:
        """``[matcher.accept_token(token) ...]`` (the parser step is Python: no threads)."""
        if len(matchers) != len(token_ids):
            raise ValueError(f"{len(matchers)} matchers but {len(token_ids)} tokens")
        return [
            matcher.accept_token(int(token))
            for matcher, token in zip(matchers, token_ids, strict=True)
        ]

    def close(self) -> None:
        """Stop the worker threads."""
        self._pool.shutdown(wait=True)


_default: BatchGrammarMatcher | None = None
_default_lock = threading.Lock()


def default_batch_matcher() -> BatchGrammarMatcher:
    """The process-wide batch matcher (threads as many as the usable CPUs), made on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = BatchGrammarMatcher()
        return _default


def _numpy_target(bitmask: Any) -> tuple[np.ndarray, Any]:
    """A writable int32 numpy view of ``bitmask`` and, for a non-CPU tensor, the tensor."""
    if isinstance(bitmask, np.ndarray):
        target = bitmask if bitmask.ndim == 2 else bitmask.reshape(1, -1)
        if target.dtype != np.int32 or not target.flags.c_contiguous:
            raise ValueError("the bitmask must be a C-contiguous int32 array")
        return target, None
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(bitmask, torch.Tensor):
        raise TypeError(
            f"bitmask must be a numpy array or a torch tensor, got {type(bitmask).__name__}"
        )
    tensor = bitmask if bitmask.dim() == 2 else bitmask.view(1, -1)
    if tensor.device.type == "cpu" and tensor.is_contiguous():
        return tensor.numpy(), None
    return np.ascontiguousarray(tensor.cpu().numpy()), tensor


def _compute(pending: deque[GrammarMatcher]) -> None:
    while True:
        try:
            matcher = pending.popleft()
        except IndexError:
            return
        matcher.next_token_mask_words()


def _walk(pending: deque[tuple[Any, int]]) -> None:
    """Walk states from ``pending`` until it is empty. A state whose shape-mate is being
    walked on another thread goes back to the end of the queue; once every state left has
    been put back in a row, the thread waits for the mate instead of spinning."""
    put_back = 0
    while True:
        try:
            compiled, state = pending.popleft()
        except IndexError:
            return
        mode = DEFER_TO_MATE if put_back <= len(pending) else WAIT_FOR_MATE
        if compiled.walk_state_scheduled(state, mode):
            put_back = 0
        else:
            pending.append((compiled, state))
            put_back += 1
