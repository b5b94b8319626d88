"""Masks of a whole batch at once: new configurations filled on native threads.

XGrammar's ``BatchGrammarMatcher`` and llguidance's parallel fill in one shape. One pass over
the rows finds the cached masks and groups the rest by configuration; the distinct new
configurations go to one native call (``native/batch.hpp``) that walks the states they need,
each once and widest first, then fills them, on ``max_threads`` threads without the GIL; then
one native copy writes every row (GIL released).
"""

from __future__ import annotations

import operator
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from formline.mask.compiled import CompiledGrammar
from formline.mask.matcher import GrammarMatcher
from formline.native import (
    MatcherCore,
    copy_masks,
    fill_masks,
    prepare_helpers,
    release_helpers,
)
from formline.parser.pushdown import Stack

StateKey = tuple[frozenset[Stack], bool, bool]  # GrammarMatcher.state_key()
# A configuration to fill: its grammar, stacks, can_end, and the rows that need it.
MissingConfiguration = tuple[CompiledGrammar, frozenset[Stack], bool, list[int]]
_compiled_of = operator.attrgetter("compiled")


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
            ValueError: ``indices`` and ``matchers`` differ in length, or a row is out of
                range or named twice.
            ParserLimitError: a matcher's walk needed more stacks than its limit.
        Costs one cached lookup and one row copy per matcher, or the mask's walk when new.
        """
        target, device_tensor = _numpy_target(bitmask)
        rows = self._rows(len(matchers), indices, target.shape[0])
        grammars = _grammars_of(matchers)
        needed = max((compiled.words for compiled in grammars.values()), default=0)
        if target.shape[1] < needed:
            raise ValueError(
                f"the bitmask's rows have {target.shape[1]} words; the vocabulary needs {needed}"
            )
        states = list(map(MatcherCore.state_key, matchers))
        masks, missing = _look_up(states, matchers, grammars)
        # Woken before the configurations are flattened, the helpers are running when the
        # fill reaches them (a woken thread began 80-120 µs after its wake on a 2-core VM;
        # see native/pool.hpp); held through the copy, they share it; released, they park.
        threads = self._threads_for(missing)
        prepare_helpers(threads)
        try:
            if missing:
                self._fill_missing(missing, masks, threads)
            # One native copy for every row (a copy per row cost 1.5 µs of buffer handling,
            # more than the 16 KiB copy itself), after the fill, rows shared by the held
            # threads: copied on the thread that filled each mask, in the fill, the 2-thread
            # cold fill took 460-470 µs against 410 (the copies met the other thread's walks).
            copy_masks(masks, target, rows, threads)
        finally:
            release_helpers(threads)
        if device_tensor is not None:
            torch = sys.modules["torch"]
            device_tensor.copy_(torch.from_numpy(target))

    @staticmethod
    def _rows(count: int, indices: Sequence[int] | None, available: int) -> np.ndarray:
        """The target row of each matcher, checked against the bitmask's ``available`` rows.

        Raises:
            ValueError: ``indices`` is not ``count`` long, or names a row out of range or
                twice.
        """
        if indices is None:
            if count > available:
                raise ValueError(f"a row index is outside the bitmask's {available} rows")
            return np.arange(count, dtype=np.int64)
        given = np.asarray(indices)
        if given.size and given.dtype.kind not in "iu":  # [1.7] was row 1, silently
            raise ValueError(f"indices must be integers, got {given.dtype}")
        rows = np.ascontiguousarray(given, dtype=np.int64)  # copy_masks takes C order
        if len(rows) != count:
            raise ValueError(f"{count} matchers but {len(rows)} indices")
        if count and (rows.min() < 0 or rows.max() >= available):
            raise ValueError(f"a row index is outside the bitmask's {available} rows")
        if count > 1:  # two threads writing one row would tear it (copy_masks shares rows)
            values, counts = np.unique(rows, return_counts=True)
            if counts.max() > 1:
                raise ValueError(f"row {values[counts.argmax()]} is named twice in indices")
        return rows

    def _threads_for(self, missing: list[MissingConfiguration]) -> int:
        """The threads a fill of ``missing`` runs on: one when nothing is missing (a cached
        batch's copy alone is not worth a wake: 20-24 µs of the caller's time on a 2-core VM
        against a 40-45 µs copy), or when a single new row is missing (one sequence meeting
        a new state: its configuration usually has one stack top to walk, which a helper
        could not share); else ``max_threads``."""
        if not missing or (len(missing) == 1 and len(missing[0][3]) == 1):
            return 1
        return self.max_threads

    def _fill_missing(
        self, missing: list[MissingConfiguration], masks: list[Any], threads: int
    ) -> None:
        """Fill each configuration of ``missing`` once (64 rows of the batch benchmark hold 30),
        cache it, and put it in ``masks`` at its rows. Costs the new states' walks and one fill
        per configuration, spread over ``threads`` threads (prepared) without the GIL.

        Raises:
            ParserLimitError: a walk needed more stacks than its grammar's limit.
        """
        kernels, configurations, can_ends, outputs = [], [], [], []
        # One pass makes the fill's arguments, places each mask in its rows and lists what
        # to cache. With the lookups, this loop and the copies one pass each, the caller's
        # part of a 64-row cold fill went from 90-92 to 77-78 µs; most of what is left is
        # cache misses on these objects after a compile (this loop: 26 µs, 12 when run
        # again at once).
        remembered: dict[int, tuple[CompiledGrammar, list]] = {}
        for grammar, stacks, can_end, positions in missing:
            words = np.empty(grammar.words, dtype=np.uint32)
            for position in positions:
                masks[position] = words
            kernels.append(grammar.kernel)
            configurations.append(stacks)
            can_ends.append(can_end)
            outputs.append(words)
            entry = remembered.get(id(grammar))
            if entry is None:
                entry = remembered[id(grammar)] = (grammar, [])
            entry[1].append((stacks, can_end, words))
        status = fill_masks(kernels, configurations, can_ends, outputs, threads)
        missing[0][0].check_status(status)  # the stack limit: the one error a fill returns
        for grammar, entries in remembered.values():
            grammar.remember_masks(entries)

    def batch_accept_token(
        self, matchers: Sequence[GrammarMatcher], token_ids: Sequence[int]
    ) -> list[bool]:
        """``[matcher.accept_token(token) ...]`` (the parser step is Python: no threads)."""
        if len(matchers) != len(token_ids):
            raise ValueError(f"{len(matchers)} matchers but {len(token_ids)} tokens")
        # operator.index as accept_token reads ids: int() took 22.9 and "22" as token 22.
        return [
            matcher.accept_token(operator.index(token))
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


def _grammars_of(matchers: Sequence[GrammarMatcher]) -> dict[int, CompiledGrammar]:
    """The batch's compiled grammars by id: one for a whole batch is the common case, so its
    words and cache are read once (per matcher, the property chain cost 32 µs for 64 rows, an
    eighth of a hot fill)."""
    compiled = list(map(_compiled_of, matchers))
    if len(set(map(id, compiled))) == 1:
        return {id(compiled[0]): compiled[0]}
    return {id(grammar): grammar for grammar in compiled}


def _look_up(
    states: list[StateKey],
    matchers: Sequence[GrammarMatcher],
    grammars: dict[int, CompiledGrammar],
) -> tuple[list[Any], list[MissingConfiguration]]:
    """The cached mask of each row (``None`` where missing) and the configurations not
    cached, each with its grammar and rows: one pass and one lock per grammar
    (:meth:`CompiledGrammar.look_up_masks`)."""
    if len(grammars) == 1:  # the common case, without splitting the rows
        only = next(iter(grammars.values()))
        found, missing = only.look_up_masks(states)
        return found, [(only, *key, positions) for key, positions in missing.items()]
    masks: list[Any] = [None] * len(states)
    missing_configurations: list[MissingConfiguration] = []
    rows_of: dict[int, list[int]] = {}
    for position, matcher in enumerate(matchers):
        rows_of.setdefault(id(matcher.compiled), []).append(position)
    for grammar_id, positions in rows_of.items():
        grammar = grammars[grammar_id]
        found, missing = grammar.look_up_masks([states[k] for k in positions])
        for position, words in zip(positions, found, strict=True):
            masks[position] = words
        for key, members in missing.items():
            missing_configurations.append((grammar, *key, [positions[k] for k in members]))
    return masks, missing_configurations


def _numpy_target(bitmask: Any) -> tuple[np.ndarray, Any]:
    """A writable int32 numpy view of ``bitmask`` and, for a non-CPU tensor, the tensor."""
    if getattr(bitmask, "ndim", 2) not in (1, 2):  # a 3-D buffer was filled as one row
        raise ValueError(f"the bitmask must have 1 or 2 dimensions, not shape {bitmask.shape}")
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
    if bitmask.dtype != torch.int32:  # else met as a buffer mismatch after the fill's work
        raise ValueError(f"the bitmask must be int32 (allocate_token_bitmask), not {bitmask.dtype}")
    tensor = bitmask if bitmask.dim() == 2 else bitmask.view(1, -1)
    if tensor.device.type == "cpu" and tensor.is_contiguous():
        return tensor.numpy(), None
    return np.ascontiguousarray(tensor.cpu().numpy()), tensor
