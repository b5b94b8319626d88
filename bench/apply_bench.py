"""Bitmask apply benchmark: formline vs XGrammar vs llguidance on CPU torch logits.

Run from the repository root::

    python -m bench.apply_bench [--repeats 200] [--output bench/results/apply.json]

The same int32 bitmask and float32 logits (``(rows, vocabulary)`` on the CPU, as vLLM's CPU
backend and formline's transformers processor hold them) go through each engine's
``apply_token_bitmask_inplace``: formline's, ``xgrammar.apply_token_bitmask_inplace``
(its CPU kernel) and ``llguidance.torch.apply_token_bitmask_inplace``. Masks are realistic
rather than random: "few" allows 5 tokens per row (JSON punctuation), "most" blocks 2,000
(inside a string). Each cell is the median over ``--repeats`` calls, after a warm-up; each
engine's result is checked equal to formline's numpy reference first.
Outputs: the JSON and ``apply.md`` next to it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.core_bench import ROOT, machine_info

VOCABULARIES = {"smollm2": 49152, "qwen2": 151936}
ROWS = (1, 16, 64)
SHAPES = ("few", "most")


def masks(rows: int, vocabulary: int, shape: str, seed: int = 0) -> np.ndarray:
    """A ``(rows, words)`` int32 bitmask: 5 tokens allowed per row, or 2,000 blocked."""
    from formline.mask.bitmask import ids_to_bitmask, words_for

    rng = np.random.default_rng(seed)
    bitmask = np.empty((rows, words_for(vocabulary)), dtype=np.int32)
    for row in range(rows):
        if shape == "few":
            ids = rng.choice(vocabulary, 5, replace=False)
        else:
            ids = np.setdiff1d(np.arange(vocabulary), rng.choice(vocabulary, 2000, replace=False))
        bitmask[row] = ids_to_bitmask(ids, bitmask.shape[1]).view(np.int32)
    return bitmask


def engines() -> dict[str, Callable[[Any, Any], None]]:
    """Each engine's apply, called as ``apply(logits, bitmask)`` on torch tensors."""
    import llguidance.torch
    import xgrammar

    from formline.mask.bitmask import apply_token_bitmask_inplace

    return {
        "formline": apply_token_bitmask_inplace,
        "xgrammar": lambda logits, bitmask: xgrammar.apply_token_bitmask_inplace(
            logits, bitmask, backend="cpu"
        ),
        "llguidance": llguidance.torch.apply_token_bitmask_inplace,
    }


def median_ms(function: Callable[[], None], repeats: int) -> float:
    function()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def run(repeats: int) -> list[dict[str, Any]]:
    import torch

    from formline.mask.bitmask import apply_token_bitmask_inplace

    rows_out = []
    for name, vocabulary in VOCABULARIES.items():
        for rows in ROWS:
            for shape in SHAPES:
                bitmask = masks(rows, vocabulary, shape)
                logits = np.random.default_rng(1).normal(size=(rows, vocabulary))
                logits = logits.astype(np.float32)
                reference = logits.copy()
                apply_token_bitmask_inplace(reference, bitmask)  # numpy
                row = {"vocabulary": name, "rows": rows, "mask": shape}
                for engine, apply in engines().items():
                    target = torch.from_numpy(logits.copy())
                    apply(target, torch.from_numpy(bitmask))
                    if not np.array_equal(target.numpy(), reference):
                        raise AssertionError(
                            f"{engine} masks differently ({name}, {rows}, {shape})"
                        )
                    mask = torch.from_numpy(bitmask)
                    row[engine] = median_ms(lambda a=apply, t=target, m=mask: a(t, m), repeats)
                rows_out.append(row)
                print(json.dumps(row), flush=True)
    return rows_out


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "# Bitmask apply on CPU torch float32 logits (median ms per call)",
        "",
        f"torch threads: {results['torch_threads']}; {results['machine']['cpu_model']}, "
        f"{results['machine']['cpus_usable']} cores.",
        "",
        "| vocabulary | rows | mask | formline | xgrammar | llguidance |",
        "|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        lines.append(
            f"| {row['vocabulary']} | {row['rows']} | {row['mask']} | {row['formline']:.3f} | "
            f"{row['xgrammar']:.3f} | {row['llguidance']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "apply.json")
    options = parser.parse_args(argv)
    import torch

    results = {
        "torch_threads": torch.get_num_threads(),
        "machine": machine_info(),
        "rows": run(options.repeats),
    }
    options.output.parent.mkdir(parents=True, exist_ok=True)
    options.output.write_text(json.dumps(results, indent=1))
    report = markdown(results)
    options.output.with_suffix(".md").write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
