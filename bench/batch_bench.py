"""Batch fill: 64 rows of one JSON schema, one thread against two, formline and XGrammar.

Run from the repository root::

    python -m bench.batch_bench [--rows 64] [--repeats 15] [--vocabulary llama-bpe]

Each row is a matcher at its own point of a valid instance (rows spread over the instance's
tokens, so they sit in different states). "cold" compiles the schema afresh before every
repeat (untimed; the compiler's caches are cleared, the vocabulary's token table and its
per-vocabulary tables stay, as in MaskBench and as the peers keep their tokenizer info), so the
fill computes each state's mask (the native trie walks); "hot"
repeats the fill on the same matchers, so it is cached lookups and row copies. XGrammar's
``BatchGrammarMatcher`` runs the same rows with ``max_threads`` 1 and 2 in the same run. The
repeats alternate one thread and two (these VMs drift by 2x between runs, so the two were
measured minutes apart before: 1.03x, 1.38x and 1.78x in three runs of one build).
``--helpers-running`` wakes formline's helper thread 0.4 ms before each 2-thread fill, so it
is already running when the fill begins, as on a machine whose idle CPUs wake at once (on
this project's VMs a parked thread starts 20-100 µs after its wake; a diagnostic, written to
``--output`` like the rest). Writes ``bench/results/batch.md``. What bounds the speed-up on
a machine, whatever the fill's Python part: ``python -m bench.diagnostics.batch_bound``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from bench.core_bench import load_tokenizer, machine_info, publish
from formline import GrammarCompiler
from formline.mask import BatchGrammarMatcher, allocate_token_bitmask
from formline.native import prepare_helpers, release_helpers
from formline.vocab import Vocabulary
from formline.vocab.fixtures import fixture_path

ROOT = Path(__file__).resolve().parents[1]
THREADS = (1, 2)
HEAD_START_SECONDS = 0.0004  # --helpers-running: the helper's wake before the fill
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "email": {"type": "string"},
        "city": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"type": "string"}},
        "notes": {"type": "string"},
        "score": {"type": "number"},
        "active": {"type": "boolean"},
    },
    "required": ["name", "email", "city", "age", "tags", "notes", "score", "active"],
    "additionalProperties": False,
}
INSTANCE = {
    "name": "Ada Lovelace",
    "email": "ada@example.org",
    "city": "London",
    "age": 36,
    "tags": ["mathematics", "poetry", "engines"],
    "notes": "Wrote the first published algorithm for the Analytical Engine.",
    "score": 97.5,
    "active": True,
}


def instance_tokens(path: Path) -> tuple[Vocabulary, list[int]]:
    """The vocabulary of the GGUF file at ``path``, and :data:`INSTANCE`'s compact JSON text
    in its tokenizer's tokens (the rows' tokens)."""
    tokenizer, _ = load_tokenizer(path)
    text = json.dumps(INSTANCE, separators=(",", ":"))
    return Vocabulary.from_gguf(path), tokenizer.encode(text, add_special_tokens=False)


def formline_rows(compiler: GrammarCompiler, tokens: list[int], rows: int) -> list[Any]:
    compiled = compiler.compile_json_schema(SCHEMA)
    matchers = []
    for row in range(rows):
        matcher = compiled.matcher()
        for token in tokens[: row * len(tokens) // rows]:
            assert matcher.accept_token(token)
        matchers.append(matcher)
    return matchers


def time_formline(
    vocabulary: Vocabulary, tokens: list[int], rows: int, repeats: int, helpers_running: bool
) -> dict[str, float]:
    bitmask = allocate_token_bitmask(rows, vocabulary.size)
    compiler = GrammarCompiler(vocabulary, disk_cache=False)
    warm = formline_rows(compiler, tokens, rows)  # the token table's per-vocabulary tables
    BatchGrammarMatcher(max_threads=1).batch_fill_next_token_bitmask(warm, bitmask)
    batches = {threads: BatchGrammarMatcher(max_threads=threads) for threads in THREADS}
    times: dict[str, list[float]] = {f"{kind}_{t}": [] for kind in ("cold", "hot") for t in THREADS}
    for _ in range(repeats):
        for threads, batch in batches.items():  # interleaved: a slow spell hits both alike
            compiler.clear_cache()  # a new schema's states; the vocabulary's tables stay
            matchers = formline_rows(compiler, tokens, rows)
            if helpers_running:
                start_helpers(threads)
            started = time.perf_counter()
            batch.batch_fill_next_token_bitmask(matchers, bitmask)
            times[f"cold_{threads}"].append(time.perf_counter() - started)
            started = time.perf_counter()
            batch.batch_fill_next_token_bitmask(matchers, bitmask)
            times[f"hot_{threads}"].append(time.perf_counter() - started)
            if helpers_running:
                release_helpers(threads)
    return {name: 1000 * statistics.median(values) for name, values in times.items()}


def start_helpers(threads: int) -> None:
    """Wake the pool's helpers and wait until they run (``--helpers-running``): they spin,
    taking the fills' jobs, until :func:`release_helpers`."""
    prepare_helpers(threads)
    woken = time.perf_counter()
    while time.perf_counter() - woken < HEAD_START_SECONDS:
        pass


def time_xgrammar(path: Path, tokens: list[int], rows: int, repeats: int) -> dict[str, float] | str:
    try:
        import xgrammar
    except ImportError as error:
        return f"not installed ({error})"
    tokenizer, _ = load_tokenizer(path)
    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer)
    bitmask = xgrammar.allocate_token_bitmask(rows, info.vocab_size)
    batches = {threads: xgrammar.BatchGrammarMatcher(max_threads=threads) for threads in THREADS}
    times: dict[str, list[float]] = {f"{kind}_{t}": [] for kind in ("cold", "hot") for t in THREADS}
    for _ in range(repeats):
        for threads, batch in batches.items():
            compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
            compiled = compiler.compile_json_schema(
                json.dumps(SCHEMA), any_whitespace=False, separators=(",", ":")
            )
            matchers = []
            for row in range(rows):
                matcher = xgrammar.GrammarMatcher(compiled)
                for token in tokens[: row * len(tokens) // rows]:
                    assert matcher.accept_token(token)
                matchers.append(matcher)
            started = time.perf_counter()
            batch.batch_fill_next_token_bitmask(matchers, bitmask)
            times[f"cold_{threads}"].append(time.perf_counter() - started)
            started = time.perf_counter()
            batch.batch_fill_next_token_bitmask(matchers, bitmask)
            times[f"hot_{threads}"].append(time.perf_counter() - started)
    return {name: 1000 * statistics.median(values) for name, values in times.items()}


def markdown(figures: dict[str, Any], arguments: argparse.Namespace) -> str:
    lines = [
        "# Batch fill",
        "",
        f"`python -m bench.batch_bench --rows {arguments.rows} --repeats {arguments.repeats} "
        f"--vocabulary {arguments.vocabulary}"
        f"{' --helpers-running' if arguments.helpers_running else ''}`; "
        f"{machine_info().get('cpu_model', '')}, "
        f"{machine_info().get('cpus_usable', '')} cores. Median ms per fill of all "
        "rows; speed-up = 1 thread / 2 threads.",
        "",
        "| engine | cold, 1 thread | cold, 2 threads | speed-up "
        "| hot, 1 thread | hot, 2 threads | speed-up |",
        "|---|---|---|---|---|---|---|",
    ]
    for engine, result in figures.items():
        if isinstance(result, str):
            lines.append(f"| {engine} | {result} | | | | | |")
            continue
        cold = result["cold_1"] / result["cold_2"]
        hot = result["hot_1"] / result["hot_2"]
        lines.append(
            f"| {engine} | {result['cold_1']:.2f} | {result['cold_2']:.2f} | {cold:.2f}x "
            f"| {result['hot_1']:.3f} | {result['hot_2']:.3f} | {hot:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--vocabulary", default="llama-bpe")
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "batch.md")
    parser.add_argument(
        "--helpers-running",
        action="store_true",
        help="wake formline's helpers 0.4 ms before each fill (a CPU that wakes at once)",
    )
    arguments = parser.parse_args(argv)
    path = fixture_path(arguments.vocabulary)
    vocabulary, tokens = instance_tokens(path)
    figures: dict[str, Any] = {
        "formline": time_formline(
            vocabulary, tokens, arguments.rows, arguments.repeats, arguments.helpers_running
        ),
        "xgrammar": time_xgrammar(path, tokens, arguments.rows, arguments.repeats),
    }
    publish(markdown(figures, arguments), arguments.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
