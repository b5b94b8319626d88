"""Masks of a whole batch at once: new configurations filled on native threads.

XGrammar's ``BatchGrammarMatcher`` and llguidance's parallel fill in one shape. Rows whose
mask is cached are copied at once (natively, GIL released). The others' distinct
configurations go to one native call (``native/batch.hpp``) that walks the states they need,
each once and widest first, then fills them, on ``max_threads`` threads without the GIL.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from formline.mask.compiled import CompiledGrammar
from formline.mask.matcher import GrammarMatcher
from formline.native import copy_masks, fill_masks, prepare_helpers, release_helpers
from formline.parser.pushdown import Stack

StateKey = tuple[frozenset[Stack], bool, bool]  # GrammarMatcher.state_key()


class BatchGrammarMatcher:
    """Fills and advances many matchers per step.

    Args:
        max_threads: worker threads (default: the CPUs this process may use).
    """

    def __init__(self, max_threads: int | None = None):
        available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        self.max_threads = max(1, max_threads or available or os.cpu_count() or 1)

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
        target, device_tensor = _numpy_target(bitmask)
        rows = self._rows(len(matchers), indices, target.shape[0])
        # One compiled grammar for a whole batch is the common case: its words are read once
        # (per matcher, the property chain cost 32 µs for 64 rows, an eighth of a hot fill).
        grammars = {id(matcher.compiled): matcher.compiled for matcher in matchers}
        needed = max((compiled.words for compiled in grammars.values()), default=0)
        if target.shape[1] < needed:
            raise ValueError(
                f"the bitmask's rows have {target.shape[1]} words; the vocabulary needs {needed}"
            )
        states = [matcher.state_key() for matcher in matchers]
        found, hits, misses = _look_up(matchers, states, grammars)
        # Cached rows are copied in one native call (a copy per row cost 1.5 µs of buffer
        # handling, more than the 16 KiB copy itself); the rest are filled natively first.
        if hits:
            copy_masks(found, target, rows if not misses else rows[hits])
        if misses:
            computed = self._fill_new(
                [matchers[k] for k in misses] if hits else matchers,
                [states[k] for k in misses] if hits else states,
            )
            copy_masks(computed, target, rows if not hits else rows[misses])
        if device_tensor is not None:
            torch = sys.modules["torch"]
            device_tensor.copy_(torch.from_numpy(target))

    @staticmethod
    def _rows(count: int, indices: Sequence[int] | None, available: int) -> np.ndarray:
        """The target row of each matcher, checked against the bitmask's ``available`` rows.

        Raises:
            ValueError: ``indices`` is not ``count`` long, or names a row out of range.
        """
        if indices is None:
            if count > available:
                raise ValueError(f"a row index is outside the bitmask's {available} rows")
            return np.arange(count, dtype=np.int64)
        rows = np.ascontiguousarray(indices, dtype=np.int64)  # copy_masks takes C order
        if len(rows) != count:
            raise ValueError(f"{count} matchers but {len(rows)} indices")
        if count and (rows.min() < 0 or rows.max() >= available):
            raise ValueError(f"a row index is outside the bitmask's {available} rows")
        return rows

    def _fill_new(
        self, matchers: Sequence[GrammarMatcher], states: Sequence[StateKey]
    ) -> list[np.ndarray]:
        """The masks of rows not cached, each distinct configuration filled once (64 rows of
        the batch benchmark hold 30), then cached. Costs the new states' walks and one fill
        per configuration, spread over the threads; under the GIL, about 0.5 µs a row."""
        # Woken before the rows below are read, the helpers are running when the fill
        # reaches them (a woken thread began 80-120 µs after its wake on a 2-core VM, about
        # what 64 rows take here; see native/pool.hpp); released after it, they park.
        threads = self.max_threads if len(matchers) > 1 else 1
        prepare_helpers(threads)
        try:
            return self._fill_configurations(matchers, states, threads)
        finally:
            release_helpers(threads)

    @staticmethod
    def _fill_configurations(
        matchers: Sequence[GrammarMatcher], states: Sequence[StateKey], threads: int
    ) -> list[np.ndarray]:
        # The copies into the bitmask stay on the calling thread, after the fill: copied on
        # the thread that filled each mask, the 2-thread cold fill took 460-470 µs against
        # 410 (the other core's writes to the bitmask's lines), and the next fill's copies
        # 57 µs against 47.
        configurations: dict[tuple[int, frozenset[Stack], bool], np.ndarray] = {}
        owners: list[CompiledGrammar] = []
        per_row: list[np.ndarray] = []
        for matcher, (stacks, can_end, _) in zip(matchers, states, strict=True):
            compiled = matcher.compiled
            key = (id(compiled), stacks, can_end)
            words = configurations.get(key)
            if words is None:
                words = configurations[key] = np.empty(compiled.words, dtype=np.uint32)
                owners.append(compiled)
            per_row.append(words)
        keys = list(configurations)
        outputs = list(configurations.values())
        status = fill_masks(
            [compiled.kernel for compiled in owners],
            [key[1] for key in keys],
            [key[2] for key in keys],
            outputs,
            threads,
        )
        owners[0].check_status(status)  # the stack limit: the one error a fill returns
        remembered: dict[int, tuple[CompiledGrammar, list]] = {}
        for compiled, key, words in zip(owners, keys, outputs, strict=True):
            entry = remembered.setdefault(id(compiled), (compiled, []))
            entry[1].append((key[1], key[2], words))
        for compiled, entries in remembered.values():
            compiled.remember_masks(entries)
        return per_row

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
        """Nothing to release (the threads live for one fill); kept for XGrammar's shape."""


_default: BatchGrammarMatcher | None = None
_default_lock = threading.Lock()


def default_batch_matcher() -> BatchGrammarMatcher:
    """The process-wide batch matcher (threads as many as the usable CPUs), made on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = BatchGrammarMatcher()
        return _default


def _look_up(
    matchers: Sequence[GrammarMatcher],
    states: Sequence[StateKey],
    grammars: dict[int, CompiledGrammar],
) -> tuple[list[np.ndarray], list[int], list[int]]:
    """The cached masks of ``matchers`` (in ``states``; terminated ones: the stop-token
    mask), the positions they are at, and the positions of the rest. One lock per grammar,
    not one per row (64 rows: 25 µs one by one, 6 µs so)."""
    cached: list[np.ndarray | None]
    if len(grammars) == 1:  # the common case, without grouping the rows
        only = next(iter(grammars.values()))
        cached = only.cached_masks([(stacks, can_end) for stacks, can_end, _ in states])
    else:
        cached = [None] * len(matchers)
        rows_of: dict[int, list[int]] = {}
        for position, matcher in enumerate(matchers):
            rows_of.setdefault(id(matcher.compiled), []).append(position)
        for grammar, positions in rows_of.items():
            looked_up = grammars[grammar].cached_masks([states[k][:2] for k in positions])
            for position, words in zip(positions, looked_up, strict=True):
                cached[position] = words
    found: list[np.ndarray] = []
    hits: list[int] = []
    misses: list[int] = []
    for position, (matcher, words, state) in enumerate(zip(matchers, cached, states, strict=True)):
        if state[2]:  # terminated: only a stop token
            words = matcher.compiled.eos_mask
        if words is None:
            misses.append(position)
        else:
            found.append(words)
            hits.append(position)
    return found, hits, misses


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
