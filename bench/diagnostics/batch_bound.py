"""What bounds the batch fill's speed-up on this machine: its native call alone, with no
Python part, one thread against two (a diagnostic of formline alone, not a benchmark).

Run from the repository root, alone (a second busy process changes every figure)::

    python -m bench.diagnostics.batch_bound [--repeats 60] [--vocabulary llama-bpe]

``batch_bench``'s cold fill (64 rows of its schema, compiled afresh before each repeat, the
rows' configurations looked up untimed) timed five ways, alternated within each repeat:

* ``whole, 1`` and ``whole, 2``: ``BatchGrammarMatcher.batch_fill_next_token_bitmask`` on one
  thread and two, as ``batch_bench`` times it;
* ``native, 1``: the distinct configurations' native fill (``fill_masks``) alone;
* ``native, 2, woken``: the same on two threads, the helper woken as the call begins: a batch
  fill whose Python part took no time at all, on this machine's thread wake;
* ``native, 2, running``: the same with the helper already spinning (woken 0.4 ms before), as
  on a machine whose idle CPU runs a woken thread at once;
* ``apart, 1 each``: two threads, each filling its own compile's configurations on one thread
  at the same moment (the median thread's time): the work split with nothing shared but the
  token table, so what is lost there is the machine's (the two cores' memory, the host).

The ratios of ``native, 1`` to the two-thread native columns are what a fill with no Python
part would reach here; the whole fill cannot do better than ``native, 2, woken`` allows.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from typing import Any

import numpy as np
from bench.batch_bench import formline_rows, instance_tokens, start_helpers

from formline import GrammarCompiler
from formline.mask import BatchGrammarMatcher, allocate_token_bitmask
from formline.native import fill_masks, prepare_helpers, release_helpers
from formline.vocab.fixtures import fixture_path

MODES = (
    "whole, 1",
    "whole, 2",
    "native, 1",
    "native, 2, woken",
    "native, 2, running",
    "apart, 1 each",
)


def native_arguments(matchers: list[Any]) -> tuple[list, list, list, list]:
    """The fill's arguments for the rows' distinct configurations not cached (untimed)."""
    compiled = matchers[0].compiled
    _, missing = compiled.look_up_masks([matcher.state_key() for matcher in matchers])
    kernels, configurations, can_ends, outputs = [], [], [], []
    for stacks, can_end in missing:
        kernels.append(compiled.kernel)
        configurations.append(stacks)
        can_ends.append(can_end)
        outputs.append(np.empty(compiled.words, dtype=np.uint32))
    return kernels, configurations, can_ends, outputs


def time_mode(mode: str, matchers: list[Any], bitmask: np.ndarray) -> float:
    """Seconds of one cold fill in ``mode``."""
    if mode.startswith("whole"):
        batch = BatchGrammarMatcher(max_threads=int(mode[-1]))
        started = time.perf_counter()
        batch.batch_fill_next_token_bitmask(matchers, bitmask)
        return time.perf_counter() - started
    arguments = native_arguments(matchers)
    if mode == "native, 1":
        started = time.perf_counter()
        fill_masks(*arguments, 1)
        return time.perf_counter() - started
    if mode.endswith("running"):
        start_helpers(2)
        started = time.perf_counter()
    else:
        started = time.perf_counter()
        prepare_helpers(2)
    fill_masks(*arguments, 2)
    elapsed = time.perf_counter() - started
    release_helpers(2)
    return elapsed


def time_apart(compilers: list[GrammarCompiler], tokens: list[int], rows: int) -> float:
    """Seconds of one cold native fill on one thread while another thread fills another
    compile's configurations at the same moment (the median thread's own time): what two
    walks' memory and the host's placement cost each other, with nothing shared but the
    token table."""
    jobs = []
    for compiler in compilers:
        compiler.clear_cache()
        jobs.append(native_arguments(formline_rows(compiler, tokens, rows)))
    barrier = threading.Barrier(len(jobs))
    durations: list[float] = []

    def fill(arguments: tuple[list, list, list, list], cpu: int) -> None:
        # Each on its own CPU: a thread woken by the barrier would otherwise often run on
        # its waker's CPU (pool.hpp), and the two would take turns on one.
        os.sched_setaffinity(0, {cpu})
        barrier.wait()
        started = time.perf_counter()
        fill_masks(*arguments, 1)
        durations.append(time.perf_counter() - started)

    cpus = sorted(os.sched_getaffinity(0))
    threads = [
        threading.Thread(target=fill, args=(job, cpus[k % len(cpus)])) for k, job in enumerate(jobs)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return statistics.median(durations)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--vocabulary", default="llama-bpe")
    arguments = parser.parse_args(argv)
    vocabulary, tokens = instance_tokens(fixture_path(arguments.vocabulary))
    compiler = GrammarCompiler(vocabulary, disk_cache=False)
    bitmask = allocate_token_bitmask(arguments.rows, vocabulary.size)
    warm = formline_rows(compiler, tokens, arguments.rows)  # the token table's tables
    BatchGrammarMatcher(max_threads=1).batch_fill_next_token_bitmask(warm, bitmask)
    pair = [compiler, GrammarCompiler(vocabulary, disk_cache=False)]
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(arguments.repeats):
        for mode in MODES:
            if mode.startswith("apart"):
                times[mode].append(time_apart(pair, tokens, arguments.rows))
                continue
            compiler.clear_cache()
            matchers = formline_rows(compiler, tokens, arguments.rows)
            times[mode].append(time_mode(mode, matchers, bitmask))
    medians = {mode: 1e6 * statistics.median(values) for mode, values in times.items()}
    for mode, value in medians.items():
        print(f"{mode:20s} {value:7.1f} µs")
    whole = medians["whole, 1"] / medians["whole, 2"]
    woken = medians["native, 1"] / medians["native, 2, woken"]
    running = medians["native, 1"] / medians["native, 2, running"]
    apart = medians["native, 1"] / medians["apart, 1 each"]
    print(f"speed-up: whole {whole:.2f}x, native woken {woken:.2f}x, native running {running:.2f}x")
    print(f"two fills apart at once: each at {apart:.2f} of its speed alone ({2 * apart:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
