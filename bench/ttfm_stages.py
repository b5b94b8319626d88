"""Where formline's time to first mask goes, stage by stage, on the MaskBench sample.

Run from the repository root (nothing else running: it times milliseconds)::

    python -m bench.ttfm_stages [--vocabulary llama-bpe] [--data tests/data/maskbench] [--warm]

Each schema that compiles is timed once, in order: the meta-schema check, the schema
compiler's setup, the schema-to-IR step (the flattening inside it apart), the cache key, the
native automaton build, the Python glue around it, the compiled grammar (the mask kernel's
setup) and the first mask. The token table is built once, untimed (vocabulary preparation,
as ``bench.maskbench`` keeps it too), and the garbage collector is off while a schema is
timed. Prints the mean of each stage over the schemas around the median of the total (40th
to 60th percentile), over all, and over the slowest tenth, in ms. ``bench.maskbench`` gives
the end-to-end figures beside the peers; this says which stage to work on.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

from formline.automata import native_build
from formline.grammar import GrammarError, ir
from formline.grammar.budget import CompileBudget
from formline.mask.compiled import CompiledGrammar, CompileStatistics
from formline.mask.compiler import CompileCache, cache_key, check_first_mask
from formline.parser import pushdown
from formline.schema import SchemaError
from formline.schema.api import check_schema
from formline.schema.compiler import SchemaCompiler, SchemaOptions
from formline.vocab import Vocabulary
from formline.vocab.fixtures import fixture_path

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("check", "setup", "ir", "flatten", "key", "native", "glue", "compiled", "first")
BANDS = (("median band", 0.4, 0.6), ("all", 0.0, 1.0), ("slowest tenth", 0.9, 1.0))


class StageClock:
    """Seconds spent in wrapped functions, by stage name."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}

    def wrap(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **keywords: Any) -> Any:
            began = time.perf_counter()
            try:
                return function(*args, **keywords)
            finally:
                self.spent[name] = self.spent.get(name, 0.0) + time.perf_counter() - began

        return timed


def time_schema(schema: Any, vocabulary: Vocabulary, table: Any, clock: StageClock) -> dict:
    """One schema's stages in seconds. Raises SchemaError/GrammarError as the compile does."""
    clock.spent.clear()
    marks = [time.perf_counter()]
    check_schema(schema)
    marks.append(time.perf_counter())
    compiler = SchemaCompiler(schema, SchemaOptions(), CompileBudget().start())
    marks.append(time.perf_counter())
    grammar = compiler.grammar()
    marks.append(time.perf_counter())
    key = cache_key(grammar, vocabulary, CompileBudget().state_limits())
    marks.append(time.perf_counter())
    automaton = pushdown.build_pushdown(grammar)
    marks.append(time.perf_counter())
    compiled = CompiledGrammar(automaton, vocabulary, table, key, CompileStatistics())
    marks.append(time.perf_counter())
    check_first_mask(compiled)
    marks.append(time.perf_counter())
    spans = [after - before for before, after in pairwise(marks)]
    flatten, native = clock.spent.get("flatten", 0.0), clock.spent.get("native", 0.0)
    return {
        "check": spans[0],
        "setup": spans[1],
        "ir": spans[2] - flatten,
        "flatten": flatten,
        "key": spans[3],
        "native": native,
        "glue": spans[4] - native,
        "compiled": spans[5],
        "first": spans[6],
        "total": sum(spans),
        "states": automaton.size,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocabulary", default="llama-bpe")
    parser.add_argument("--data", type=Path, default=ROOT / "tests" / "data" / "maskbench")
    parser.add_argument("--slowest", type=int, default=0, help="also list the N slowest")
    parser.add_argument(
        "--warm",
        action="store_true",
        help="no garbage collection between schemas: the CPU's caches stay warm (the "
        "default collects before each schema, as bench.maskbench does, which leaves them cold)",
    )
    options = parser.parse_args()
    vocabulary = Vocabulary.from_gguf(fixture_path(options.vocabulary))
    table = CompileCache(disk_cache=False).token_table(vocabulary)
    clock = StageClock()
    # The stages inside the grammar's construction and the automaton build.
    ir.flatten = clock.wrap("flatten", ir.flatten)
    native_build.native_build_automaton = clock.wrap("native", native_build.native_build_automaton)
    rows = []
    for path in sorted(options.data.glob("*.json")):
        data = json.loads(path.read_text())
        if not options.warm:
            gc.collect()
        gc.disable()
        try:
            row = time_schema(data.get("schema", data), vocabulary, table, clock)
            rows.append({**row, "name": path.stem})
        except (SchemaError, GrammarError):
            pass  # declined schemas: bench.maskbench counts them
        finally:
            gc.enable()
    if not rows:
        raise SystemExit(f"no schema of {options.data} compiled")
    rows.sort(key=lambda row: row["total"])
    print(f"{len(rows)} schemas compiled; mean ms per stage (states: automaton size)")
    print("| band | " + " | ".join(STAGES) + " | total | states |")
    print("|---" * (len(STAGES) + 3) + "|")
    for label, low, high in BANDS:
        first = min(int(low * len(rows)), len(rows) - 1)  # one row at least: a small --data
        chosen = rows[first : max(int(high * len(rows)), first + 1)]
        means = [1e3 * sum(row[stage] for row in chosen) / len(chosen) for stage in STAGES]
        total = 1e3 * sum(row["total"] for row in chosen) / len(chosen)
        states = sum(row["states"] for row in chosen) / len(chosen)
        cells = " | ".join(f"{mean:.2f}" for mean in means)
        print(f"| {label} | {cells} | {total:.2f} | {states:,.0f} |")
    for row in rows[::-1][: options.slowest]:
        cells = " | ".join(f"{1e3 * row[stage]:.2f}" for stage in STAGES)
        print(f"| {row['name']} | {cells} | {1e3 * row['total']:.2f} | {row['states']:,} |")


if __name__ == "__main__":
    main()
