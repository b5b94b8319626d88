"""``formline eval``: the free-vs-constrained experiment on any model and any task set.

Runs every task of an extraction-dev-style file under each variant, then writes
predictions.jsonl, results.json, results.csv, results.md and the plots under ``--out``.
``--plot`` only redraws the plots from a saved results.json (no model).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from formline.cli.arguments import at_least
from formline.evaluation.dataset import extraction_dev_tasks
from formline.evaluation.plots import plot_all
from formline.evaluation.report import load_results, write_all
from formline.evaluation.runner import (
    RECORDS_FILE,
    compile_times,
    load_tasks,
    prediction,
    run_all,
    summarize_variant,
)
from formline.evaluation.variants import DEFAULT_VARIANTS, VARIANTS, parse_variants
from formline.pipeline.generate import backend_for

DEFAULT_MAX_TOKENS = 200
EMBEDDED_MODEL = "SmolLM2-135M-Instruct Q4_1 (embedded)"


def default_tasks() -> Path:
    """The extraction-dev set shipped with formline (package data, see
    :mod:`formline.evaluation.dataset`)."""
    return extraction_dev_tasks()


def _shown(tasks_file: Path) -> str:
    """The tasks file as the results name it: the shipped set by its place in the package
    (not this machine's install path), any other file as given."""
    if tasks_file.resolve() == extraction_dev_tasks().resolve():
        return "formline/evaluation/data/extraction-dev/tasks.jsonl (shipped with formline)"
    return str(tasks_file)


def register(commands: Any) -> None:
    """Add the ``eval`` sub-command to an argparse sub-parsers object."""
    command = commands.add_parser("eval", help="free vs constrained decoding on a task set")
    command.add_argument(
        "--tasks", help="a tasks JSONL file (default: the extraction-dev set shipped with formline)"
    )
    command.add_argument("--model", help="a GGUF file or HF model directory (default: SmolLM2)")
    command.add_argument("--backend", default="llama_cpp", choices=("llama_cpp", "transformers"))
    command.add_argument(
        "--variants",
        help=f"comma-separated, or 'all' (default: {','.join(DEFAULT_VARIANTS)}; "
        f"known: {', '.join(VARIANTS)})",
    )
    command.add_argument("--out", default="eval-results", help="output folder")
    command.add_argument("--limit", type=at_least(1, int), help="the first N tasks of each type")
    command.add_argument("--max-tokens", type=at_least(1, int), default=DEFAULT_MAX_TOKENS)
    command.add_argument("--threads", type=at_least(1, int), default=1, help="llama.cpp threads")
    command.add_argument(
        "--plot", action="store_true", help="only redraw the plots from OUT/results.json"
    )
    command.add_argument("--no-progress", action="store_true", help="no progress bar")
    command.set_defaults(handler=run_eval)


def run_eval(arguments: argparse.Namespace) -> int:
    out = Path(arguments.out)
    if arguments.plot:
        paths = plot_all(load_results(out), out)
        print("\n".join(str(path) for path in paths))
        return 0
    results = _run(arguments, out)
    try:
        plot_all(results, out)
    except ValueError as error:  # matplotlib missing: the tables are still written
        print(f"formline: warning: {error}", file=sys.stderr)
    print((out / "results.md").read_text(encoding="utf-8"))
    return 0


def _backend(arguments: argparse.Namespace) -> Any:
    options = {"n_threads": arguments.threads} if arguments.backend == "llama_cpp" else {}
    return backend_for(arguments.model, arguments.backend, **options)


def _run(arguments: argparse.Namespace, out: Path) -> dict[str, Any]:
    variants = parse_variants(arguments.variants)
    tasks_file = Path(arguments.tasks) if arguments.tasks else default_tasks()
    tasks = load_tasks(tasks_file, arguments.limit)
    if not tasks:
        raise ValueError(f"no tasks in {tasks_file}")
    started = time.perf_counter()
    backend = _backend(arguments)
    compiles = compile_times(variants, tasks, backend)
    progress = not arguments.no_progress
    out.mkdir(parents=True, exist_ok=True)
    records_path = out / RECORDS_FILE
    model = f"{arguments.model or EMBEDDED_MODEL} on {arguments.backend}"
    records = run_all(tasks, variants, backend, arguments.max_tokens, progress, records_path, model)
    summaries = {
        name: {**summarize_variant(tasks, found), **compiles[name]}
        for name, found in records.items()
    }
    results = {"meta": _meta(arguments, tasks_file, len(tasks), started), "variants": summaries}
    predictions = [prediction(record) for found in records.values() for record in found]
    write_all(results, predictions, out)
    return results


def _meta(
    arguments: argparse.Namespace, tasks_file: Path, count: int, started: float
) -> dict[str, Any]:
    return {
        "command": _command(arguments),
        "model": arguments.model or EMBEDDED_MODEL,
        "backend": arguments.backend,
        "threads": arguments.threads,
        "tasks_file": _shown(tasks_file),
        "tasks": count,
        "max_tokens": arguments.max_tokens,
        "seconds": time.perf_counter() - started,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}",
    }


def _command(arguments: argparse.Namespace) -> str:
    """The command line that reproduces the run (flags that differ from the defaults)."""
    parts = ["formline eval"]
    for flag in ("tasks", "model", "variants", "out", "limit"):
        value = getattr(arguments, flag)
        if value is not None:
            parts.append(f"--{flag} {value}")
    if arguments.backend != "llama_cpp":
        parts.append(f"--backend {arguments.backend}")
    if arguments.max_tokens != DEFAULT_MAX_TOKENS:
        parts.append(f"--max-tokens {arguments.max_tokens}")
    if arguments.threads != 1:  # llama.cpp's sums may round differently on other threads
        parts.append(f"--threads {arguments.threads}")
    return " ".join(parts)
