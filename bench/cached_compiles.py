"""A server's stream of new schemas: compile after compile, the garbage collector on.

Run from the repository root (nothing else running: it times milliseconds)::

    python -m bench.cached_compiles [--rounds 3] [--engines formline,llguidance,xgrammar]
        [--vocabulary llama-bpe] [--data tests/data/maskbench]

Each engine, in a process of its own, compiles every MaskBench schema of ``--data`` once per
round and fills the first mask: what a server that gets a new schema per request does. Each
round has a compiler of its own, made at startup, so that no compile is a cache hit (a
``$comment`` naming the round does not change a schema's grammar, and formline's cache of
compiled grammars is keyed by the grammar), and the earlier rounds' compilers are kept with
all they hold; from the second round on each schema carries that ``$comment`` too, against
any cache keyed by the schema's text. Unlike ``bench.maskbench``, nothing is cleared between
compiles and the garbage collector is left on, so a compile also pays the collections that
its garbage and everything kept so far cost. The objects made at startup (imports, the
vocabulary, the compilers) are frozen out of the collector's scans first, for every engine,
as ``formline serve`` does. formline's compilers keep what they compiled (the memory cache,
on by default); the peers are set up as in ``bench.maskbench`` (XGrammar's cache off), and
their compiled grammars are dropped after the first mask.

Prints, and writes to ``bench/results/cached_compiles.md`` (``.json`` beside it): time to
first mask p50 / p99 / max, the full (generation 2) collections, the longest one, all
collections' time, and the objects the collector tracks at the end.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.core_bench import ROOT, VocabularyContext, _names, load_tokenizer, machine_info
from bench.core_bench import progress as say
from bench.maskbench import ALL_ENGINES, DATA, vocabulary_setup
from bench.maskbench_engines import ENGINES, UnsupportedSchemaError


class CollectionClock:
    """Each garbage collection's generation and milliseconds (a ``gc.callbacks`` entry)."""

    def __init__(self) -> None:
        self.collections: list[tuple[int, float]] = []
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            spent = (time.perf_counter() - self._began) * 1e3
            self.collections.append((info["generation"], spent))


def variant(schema: Any, round_number: int) -> Any:
    """``schema`` as new to every cache: a ``$comment`` naming the round (from round 1)."""
    if round_number == 0 or not isinstance(schema, dict):
        return schema
    return {**schema, "$comment": f"round {round_number}"}


def run_engine(name: str, vocabulary: dict[str, Any], schemas: list[Any], rounds: int) -> dict:
    """One engine's compiles (in its own process): the times, the collections, the objects."""
    path = Path(vocabulary["path"])
    tokenizer = None if name == "formline" else load_tokenizer(path)[0]
    size, eos_id = vocabulary["size"], vocabulary["eos_id"]
    context = VocabularyContext(vocabulary["name"], path, tokenizer, 0.0, size, eos_id)
    engines = [ENGINES[name]() for _ in range(rounds)]
    for engine in engines:
        engine.prepare(context)
    bitmask = engines[0].allocate(context)
    gc.collect()
    gc.freeze()  # the startup's objects: out of every collection's scans, as formline serve
    clock = CollectionClock()
    gc.callbacks.append(clock)
    times: dict[str, float] = {}  # "round:schema index" -> ms
    declined = 0
    for round_number, engine in enumerate(engines):
        for index, schema in enumerate(schemas):
            chosen = variant(schema, round_number)
            began = time.perf_counter_ns()
            try:
                compiled = engine.compile_schema(chosen)
            except UnsupportedSchemaError:
                declined += 1
                continue
            engine.fill(engine.new_matcher(compiled), bitmask)
            times[f"{round_number}:{index}"] = (time.perf_counter_ns() - began) / 1e6
            del compiled
    gc.callbacks.remove(clock)
    full = [spent for generation, spent in clock.collections if generation == 2]
    return {
        "engine": name,
        "version": engines[0].version(),
        "compiles": len(times),
        "declined": declined,
        "ttfm_ms": spread(list(times.values())),
        "round_p50_ms": [
            spread([ms for key, ms in times.items() if key.startswith(f"{number}:")])["p50"]
            for number in range(rounds)
        ],
        "collections": len(clock.collections),
        "full_collections": len(full),
        "longest_full_ms": max(full, default=0.0),
        "collections_ms": sum(spent for _, spent in clock.collections),
        "tracked_objects": len(gc.get_objects()),
        "times": times,
    }


def spread(times: list[float]) -> dict[str, float]:
    """p50, p99, max and mean of ``times``."""
    spent = np.asarray(times)
    quantiles = np.percentile(spent, [50, 99])
    return {"p50": quantiles[0], "p99": quantiles[1], "max": spent.max(), "mean": spent.mean()}


def _in_child(name: str, vocabulary: dict, schemas: list, rounds: int, queue: Any) -> None:
    queue.put(run_engine(name, vocabulary, schemas, rounds))


def markdown(results: list[dict[str, Any]], command: str, machine: dict[str, Any]) -> str:
    lines = [
        "# Compiles in a row, the garbage collector on",
        "",
        f"`{command}`; {machine.get('cpu_model', '?')}, {machine.get('cpus_usable', '?')} "
        "cores. Time to first mask (compile + matcher + first fill) of every compile, ms; full: "
        "generation-2 collections; objects: what the collector tracks at the end.",
        "",
        "| engine | compiles | TTFM p50 / p99 / max ms | mean ms | p50 by round ms | "
        "collections (full) | longest full ms | all collections ms | objects |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results:
        ttfm = row["ttfm_ms"]
        by_round = " / ".join(f"{ms:.2f}" for ms in row["round_p50_ms"])
        lines.append(
            f"| {row['engine']} {row['version']} | {row['compiles']:,} | "
            f"{ttfm['p50']:.2f} / {ttfm['p99']:.2f} / {ttfm['max']:.1f} | {ttfm['mean']:.2f} | "
            f"{by_round} | "
            f"{row['collections']:,} ({row['full_collections']}) | "
            f"{row['longest_full_ms']:.1f} | {row['collections_ms']:.0f} | "
            f"{row['tracked_objects']:,} |"
        )
    common = set.intersection(*(set(row["times"]) for row in results))
    lines += [
        "",
        f"The {len(common):,} compiles that every engine made (a peer declines some schemas):",
        "",
        "| engine | TTFM p50 / p99 / max ms | mean ms |",
        "|---|---|---|",
    ]
    for row in results:
        ttfm = spread([row["times"][key] for key in common])
        lines.append(
            f"| {row['engine']} | {ttfm['p50']:.2f} / {ttfm['p99']:.2f} / {ttfm['max']:.1f} | "
            f"{ttfm['mean']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(arguments: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.cached_compiles", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--rounds", type=int, default=3, help="passes over the schemas (3)")
    parser.add_argument(
        "--engines",
        type=lambda text: _names(text, ALL_ENGINES, "engines"),
        default=list(ALL_ENGINES),
        help="comma-separated subset of: formline,llguidance,xgrammar (default: all)",
    )
    parser.add_argument("--vocabulary", default="llama-bpe")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument(
        "--output", type=Path, default=ROOT / "bench" / "results" / "cached_compiles.json"
    )
    options = parser.parse_args(arguments)
    if options.rounds < 1:
        parser.error("--rounds must be at least 1")
    documents = [json.loads(path.read_text()) for path in sorted(options.data.glob("*.json"))]
    schemas = [document.get("schema", document) for document in documents]
    vocabulary, _, _ = vocabulary_setup(options.vocabulary)
    context = multiprocessing.get_context("spawn")
    results = []
    for name in options.engines:
        say(f"{name}: {options.rounds} x {len(schemas)} compiles")
        queue = context.Queue()
        process = context.Process(
            target=_in_child, args=(name, vocabulary, schemas, options.rounds, queue)
        )
        process.start()
        results.append(queue.get())
        process.join()
    given = sys.argv[1:] if arguments is None else arguments
    command = "python -m bench.cached_compiles " + " ".join(given)
    machine = machine_info()
    text = markdown(results, command.strip(), machine)
    print(text)
    options.output.parent.mkdir(parents=True, exist_ok=True)
    report = {"command": command.strip(), "machine": machine, "results": results}
    options.output.write_text(json.dumps(report, indent=1) + "\n")
    options.output.with_suffix(".md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
