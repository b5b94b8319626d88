"""``formline trace``: record a real generation and write the six-step explainer page."""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Any

from formline.cli.arguments import at_least
from formline.schema import schema_of
from formline.trace.html import write_trace_html
from formline.trace.recorder import load_trace_backend, record_trace


def run_trace(arguments: argparse.Namespace) -> int:
    """Record the trace and write its page.

    Raises:
        ValueError: the schema is a boolean one, or ``--out``'s folder is missing or not
            writable (checked before the model loads and the minutes of recording).
    """
    schema = schema_of(Path(arguments.schema).read_text(encoding="utf-8"))
    if not isinstance(schema, dict):
        raise ValueError("formline trace needs an object JSON Schema, not a boolean schema")
    out = Path(arguments.out)
    folder = out.resolve().parent
    if out.is_dir() or not folder.is_dir() or not os.access(folder, os.W_OK):
        raise ValueError(f"--out {arguments.out}: not a file this user can write in {folder}")
    backend = load_trace_backend(arguments.model, n_threads=arguments.threads)
    trace = record_trace(
        schema,
        arguments.prompt,
        backend,
        free_samples=arguments.free_samples,
        temperature=arguments.temperature,
        max_tokens=arguments.max_tokens,
        seed=arguments.seed,
        field_orders=not arguments.no_field_orders,
        progress=not arguments.no_progress,
    )
    path = write_trace_html(trace, arguments.out)
    steps = trace["constrained"]["steps"]
    print(f"{path}: {len(steps)} constrained steps, {arguments.free_samples} samples per mode")
    if trace["field_orders_note"]:
        print(f"field order comparison skipped: {trace['field_orders_note']}", file=sys.stderr)
    return 0


def finite_temperature(text: str) -> float:
    """An argparse type for ``--temperature``: a finite float, 0 or more (``nan`` and
    ``inf`` passed ``at_least`` and the page's JSON, written without NaN, then failed after
    the whole recording).

    Raises:
        argparse.ArgumentTypeError: the value is not finite (argparse: a usage error).
    """
    value: float = at_least(0.0, float)(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


finite_temperature.__name__ = "float"  # argparse names the type in its "invalid ..." message


def register(commands: Any) -> None:
    """Add the ``trace`` sub-command to ``commands`` (an argparse sub-parsers object)."""
    trace = commands.add_parser("trace", help="record a generation, write the explainer page")
    trace.add_argument("prompt", help="the request")
    trace.add_argument("--schema", required=True, help="a JSON Schema file")
    trace.add_argument(
        "--free-samples", type=at_least(1, int), default=8, help="samples per mode (N)"
    )
    trace.add_argument(
        "--temperature", type=finite_temperature, default=0.8, help="sampling temperature T"
    )
    trace.add_argument("--max-tokens", type=at_least(1, int), default=96)
    trace.add_argument("--seed", type=int, default=0)
    trace.add_argument("--model", help="a GGUF file (default: the embedded SmolLM2)")
    trace.add_argument("--threads", type=at_least(1, int), default=1, help="llama.cpp threads")
    trace.add_argument("--no-field-orders", action="store_true", help="skip the order runs")
    trace.add_argument("--out", default="trace.html", help="the HTML file to write")
    trace.add_argument("--no-progress", action="store_true", help="no progress bar")
    trace.set_defaults(handler=run_trace)
