"""MaskBench: formline vs. llguidance vs. XGrammar on real JSON schemas with test instances.

Run from the repository root::

    python -m bench.maskbench [--data DIR] [--vocabularies llama-bpe,smollm2]
        [--engines formline,llguidance,xgrammar] [--limit N] [--sample K] [--timeout S]
        [--output bench/results/maskbench.json]

Every schema is compiled by every engine (each engine x vocabulary in its own worker process,
killed and restarted when a schema runs past its time limit); every test instance, serialized
compactly and tokenized canonically, is walked token by token with a mask before each step and
then must (valid) or must not (invalid) be allowed to end. See bench/README.md.

Statuses of an engine's result for a schema: ``compiled`` (walked), ``unsupported`` (the
engine's documented refusal), ``timeout`` / ``walk_timeout`` (killed past the time limits),
``limit`` / ``walk_limit`` (the engine stopped at its own compile limit: counted with the
timeouts), ``crash`` and ``setup_error``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import re
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from bench.core_bench import (
    ROOT,
    _cell,
    _names,
    _percentile_us,
    load_tokenizer,
    machine_info,
    progress,
)
from bench.maskbench_engines import ENGINES, short, worker_main

ALL_VOCABULARIES = ("llama-bpe", "smollm2")
ALL_ENGINES = ("formline", "llguidance", "xgrammar")
# The repository's MaskBench sample (300 files, stratified over the subsets; its SOURCE.md).
DATA = ROOT / "tests" / "data" / "maskbench"
SETUP_TIMEOUT_S = 300.0


def subset_of(name: str) -> str:
    """``Github_easy---o1.json`` -> ``Github_easy``; ``BFCL_java_5.json`` -> ``BFCL_java``."""
    stem = name.removesuffix(".json")
    if "---" in stem:
        return stem.split("---", 1)[0]
    return re.sub(r"_\d+$", "", stem)


def _shown(path: Path) -> str:
    """``path`` relative to the repository when it is inside it (results carry no home)."""
    resolved = path.resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(path)


def select_files(directory: Path, sample: int, limit: int | None) -> list[Path]:
    """Sorted ``*.json`` files, every ``sample``-th, the first ``limit`` of those."""
    files = sorted(directory.glob("*.json"))[::sample]
    return files[:limit] if limit is not None else files


def compact(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


class Worker:
    """One engine on one vocabulary in a child process; restarted after a timeout or a death."""

    def __init__(self, engine: str, vocabulary: dict[str, Any]) -> None:
        self.engine = engine
        self.vocabulary = vocabulary
        self.process: Any = None
        self.conn: Any = None
        self.info: dict[str, Any] = {}
        self.setup_error = ""
        self.restarts = 0

    def start(self) -> bool:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=worker_main, args=(child, self.engine, self.vocabulary), daemon=True
        )
        self.process.start()
        child.close()
        message: tuple[str, Any] = self.receive(SETUP_TIMEOUT_S) or (
            "setup_error",
            "setup timed out",
        )
        kind, payload = message
        if kind != "ready":
            self.setup_error = str(payload)
            self.stop()
            return False
        self.info = payload
        return True

    def receive(self, timeout: float) -> tuple[str, Any] | None:
        """The next message, ("died", exit code) if the process ended, None on timeout."""
        try:
            if self.conn.poll(timeout):
                return self.conn.recv()
        except (EOFError, OSError):
            pass
        else:
            return None
        self.process.join(5)
        return ("died", self.process.exitcode)

    def stop(self) -> None:
        if self.process is not None:
            if self.process.is_alive():
                self.process.kill()
            self.process.join()
            self.conn.close()
        self.process = None

    def run(self, job: dict[str, Any], timeout: float, walk_timeout: float) -> dict[str, Any]:
        if self.process is not None and not self.process.is_alive():
            self.stop()  # died between schemas: start afresh
        if self.process is None and (self.setup_error or not self.start()):
            return {"status": "setup_error", "error": self.setup_error}
        partial: dict[str, Any] = {}
        try:
            self.conn.send(job)
        except OSError:
            message: tuple[str, Any] | None = ("died", self.process.exitcode)
        else:
            message = self.receive(SETUP_TIMEOUT_S)  # cache clearing and gc before the compile
        if message is not None and message[0] == "started":
            message = self.receive(timeout)
        if message is not None and message[0] == "compiled":
            partial = message[1]
            message = self.receive(walk_timeout)
        if message is not None and message[0] == "done":
            return message[1]
        self.stop()
        self.restarts += 1
        if message is None:
            status = "walk_timeout" if partial else "timeout"
            limit = walk_timeout if partial else timeout
            return {**partial, "status": status, "error": f"no answer within {limit:g} s"}
        return {**partial, "status": "crash", "error": f"worker died (exit code {message[1]})"}


def vocabulary_setup(name: str) -> tuple[dict[str, Any], Any, Any]:
    """The worker's description of a vocabulary, its HF tokenizer and formline's token bytes."""
    from formline.vocab import Vocabulary
    from formline.vocab.fixtures import fixture_path

    path = fixture_path(name)
    tokenizer, load_ms = load_tokenizer(path)
    vocabulary = Vocabulary.from_gguf(path)
    eos_id = tokenizer.eos_token_id
    if eos_id is None or eos_id not in vocabulary.eos_ids:
        eos_id = min(vocabulary.eos_ids)
    description = {
        "name": name,
        "path": str(path),
        "size": vocabulary.size,
        "eos_id": eos_id,
        "hf_tokenizer_load_ms": load_ms,
    }
    return description, tokenizer, vocabulary.token_bytes


def make_job(
    document: dict[str, Any], tokenizer: Any, token_bytes: list[bytes], eos_id: int
) -> tuple[dict[str, Any], list[str]]:
    """The schema and its tokenized instances, plus instances whose tokens do not round-trip."""
    instances, problems = [], []
    for index, test in enumerate(document.get("tests", [])):
        text = compact(test["data"])
        tokens = list(tokenizer.encode(text, add_special_tokens=False))
        joined = b"".join(
            token_bytes[token] if token < len(token_bytes) else b"?" for token in tokens
        )
        if joined != text.encode("utf-8"):
            problems.append(f"test #{index}: token bytes do not give the text back")
        instances.append(
            {
                "valid": bool(test["valid"]),
                "tokens": tokens,
                "data": test["data"],
                "description": short(test.get("description", "")),
            }
        )
    return {"schema": document["schema"], "instances": instances, "eos_id": eos_id}, problems


# Statuses counted in the "timeouts" and "walk_timeouts" totals: a peer killed past the time
# limit and formline stopping at its own limit (time, states, stacks) are the same outcome.
TIMEOUT_STATUSES = ("timeout", "limit")
WALK_TIMEOUT_STATUSES = ("walk_timeout", "walk_limit")


def passing(result: dict[str, Any]) -> bool:
    return (
        result["status"] == "compiled"
        and not result["valid_refused"]
        and not result["valid_flagged"]
        and not result["invalid_accepted"]
        and not any(text.startswith("unsound") for text in result["mismatches"])
    )


def progress_cell(engine: str, result: dict[str, Any]) -> str:
    status = result["status"]
    if status != "compiled":
        return f"{engine} {status.upper()}"
    counts = [
        f"{len(result[name])} {name.replace('_', ' ')}"
        for name in ("valid_refused", "valid_flagged", "invalid_accepted", "mismatches")
        if result[name]
    ]
    verdict = (("pass " if passing(result) else "FAIL ") + ", ".join(counts)).strip()
    return f"{engine} {result['ttfm_ms']:.1f} ms {verdict}"


def has_checked_after(result: dict[str, Any]) -> bool:
    """Whether the engine's compile report leaves a keyword to its after-check (formline's
    ``details``; also read from results written before ``checked_after_count`` existed)."""
    details = result.get("details") or {}
    return bool(
        details.get("checked_after_count", len(details.get("checked_after", ())))
        or details.get("unsupported")
    )


def summarize(
    rows: list[dict[str, Any]], engine: str, vocabulary: str, engines: list[str]
) -> dict[str, Any]:
    """Totals of one engine x vocabulary over all schemas, and its times over the schemas
    that every engine of the run walked (``common_*``: each engine's own figures cover the
    schemas it compiled, and those an engine refuses are mostly the large ones).

    ``passing_with_instances`` counts over the schemas with at least one test instance
    (``schemas_with_instances``): a schema without instances passes once it compiled."""
    chosen = [row for row in rows if row["vocabulary"] == vocabulary]
    results = [row["engines"][engine] for row in chosen]
    common = [
        row["engines"][engine]
        for row in chosen
        if all(row["engines"][name]["status"] == "compiled" for name in engines)
    ]
    return {
        "engine": engine,
        "vocabulary": vocabulary,
        **_counts(engine, chosen, results),
        **_times(results, ""),
        "common_schemas": len(common),
        **_times(common, "common_"),
    }


def _counts(engine: str, chosen: list[dict[str, Any]], results: list[dict[str, Any]]) -> dict:
    """:func:`summarize`'s counts: schemas compiled, passing, instances refused or accepted,
    failures."""
    with_instances = [row["engines"][engine] for row in chosen if row.get("instances", 1)]
    compiled = [result for result in results if "ttfm_ms" in result]
    walked = [result for result in results if result["status"] == "compiled"]

    def total(name: str) -> int:
        return sum(len(result[name]) for result in walked)

    def mismatches(kind: str) -> int:
        return sum(text.startswith(kind) for result in walked for text in result["mismatches"])

    def statuses(*names: str) -> int:
        return sum(result["status"] in names for result in results)

    return {
        "schemas": len(results),
        "compiled": len(compiled),
        "compiled_with_warnings": sum(bool(result["warnings"]) for result in compiled),
        # formline's counterpart of a warning: compiled, with keywords left to the after-check
        # (None for an engine without one).
        "compiled_with_checked_after": (
            sum(has_checked_after(result) for result in compiled)
            if ENGINES[engine].has_after_check
            else None
        ),
        "passing": sum(passing(result) for result in results),
        "schemas_with_instances": len(with_instances),
        "passing_with_instances": sum(passing(result) for result in with_instances),
        "unsupported": statuses("unsupported"),
        "valid_instances": sum(result["valid"] for result in walked),
        "valid_refused": total("valid_refused"),
        "valid_flagged": total("valid_flagged"),
        "invalid_instances": sum(result["invalid"] for result in walked),
        "invalid_refused": sum(result["invalid_refused"] for result in walked),
        "invalid_caught_after": sum(result["invalid_caught"] for result in walked),
        "invalid_accepted": total("invalid_accepted"),
        "mask_unsound": mismatches("unsound"),
        "mask_stricter": mismatches("stricter"),
        "crashes": statuses("crash", "setup_error"),
        "timeouts": statuses(*TIMEOUT_STATUSES),
        "walk_timeouts": statuses(*WALK_TIMEOUT_STATUSES),
        "limits": statuses("limit", "walk_limit"),
    }


def _times(results: list[dict[str, Any]], prefix: str) -> dict[str, Any]:
    """:func:`summarize`'s times over ``results``, their keys prefixed: time to first mask
    over the schemas compiled; masks, first-walk masks and accepts over those walked (the
    common set's keeps the columns the README compares)."""
    ttfm = [result["ttfm_ms"] for result in results if "ttfm_ms" in result]
    walked = [result for result in results if result["status"] == "compiled"]
    masks = [value for result in walked for value in result["mask_ns"]]
    accepts = [value for result in walked for value in result["accept_ns"]]
    times: dict[str, Any] = {
        "ttfm_p50_ms": statistics.median(ttfm) if ttfm else None,
        "ttfm_p99_ms": float(np.percentile(ttfm, 99)) if ttfm else None,
        "mask_p50_us": _percentile_us(masks, 50),
        "mask_p99_us": _percentile_us(masks, 99),
        "accept_p50_us": _percentile_us(accepts, 50),
    }
    if not prefix:
        first_walk = [value for result in walked for value in result["first_walk_mask_ns"]]
        times |= {
            "ttfm_max_ms": max(ttfm) if ttfm else None,
            "mask_max_us": max(masks) / 1e3 if masks else None,
            "masks_measured": len(masks),
            "first_walk_mask_p50_us": _percentile_us(first_walk, 50),
            "first_walk_mask_p99_us": _percentile_us(first_walk, 99),
            "first_walk_masks_measured": len(first_walk),
        }
    return {prefix + key: value for key, value in times.items()}


def compiled_cell(row: dict[str, Any]) -> str:
    """``compiled/schemas (N warned)``; for an engine with an after-check, also the schemas
    it compiled with keywords checked after, its counterpart of a peer's warning."""
    notes = [f"{row['compiled_with_warnings']} warned"]
    if row.get("compiled_with_checked_after") is not None:
        notes.insert(0, f"{row['compiled_with_checked_after']} checked after")
    return f"{row['compiled']}/{row['schemas']} ({', '.join(notes)})"


def markdown(
    summaries: list[dict[str, Any]], rows: list[dict[str, Any]], engines: list[str]
) -> str:
    lines = [
        "| vocabulary | engine | compiled | passing (with instances) | valid refused | "
        "invalid accepted (caught after) | mask unsound / stricter | crashes | "
        "timeouts (walk) | TTFM p50 / p99 ms | mask p50 / p99 / max µs | "
        "first-walk mask p50 / p99 µs | accept p50 µs |",
        "|" + "---|" * 13,
    ]
    for row in summaries:
        lines.append(
            f"| {row['vocabulary']} | {row['engine']} | {compiled_cell(row)} | "
            f"{row['passing']} ({row['passing_with_instances']}/"
            f"{row['schemas_with_instances']}) | {row['valid_refused'] + row['valid_flagged']} | "
            f"{row['invalid_accepted']} ({row['invalid_caught_after']}) | "
            f"{row['mask_unsound']} / {row['mask_stricter']} | {row['crashes']} | "
            f"{row['timeouts']} ({row['walk_timeouts']}) | "
            f"{_cell(row['ttfm_p50_ms'], 2)} / {_cell(row['ttfm_p99_ms'])} | "
            f"{_cell(row['mask_p50_us'])} / {_cell(row['mask_p99_us'])} / "
            f"{_cell(row['mask_max_us'])} | {_cell(row['first_walk_mask_p50_us'])} / "
            f"{_cell(row['first_walk_mask_p99_us'])} | {_cell(row['accept_p50_us'])} |"
        )
    lines += [
        "",
        "compiled: formline's *checked after* counts the schemas it compiled with keywords "
        "left to its after-check (its compile report), the counterpart of a peer's warning. "
        "passing (with instances): over the schemas that have test instances, passing / "
        "schemas (a schema without instances passes once it compiles). timeouts: killed past "
        "the time limit or stopped at the engine's own compile limit. first-walk mask: the "
        "fills of each schema's first instance walked, before any other walk could warm a "
        "mask cache (formline shares one per compiled grammar across its instances).",
        "",
        "The same times over the schemas that every engine of the run walked.",
        "",
        "| vocabulary | engine | schemas | TTFM p50 / p99 ms | mask p50 / p99 µs | accept p50 µs |",
        "|" + "---|" * 6,
    ]
    for row in summaries:
        lines.append(
            f"| {row['vocabulary']} | {row['engine']} | {row['common_schemas']} | "
            f"{_cell(row['common_ttfm_p50_ms'], 2)} / {_cell(row['common_ttfm_p99_ms'])} | "
            f"{_cell(row['common_mask_p50_us'])} / {_cell(row['common_mask_p99_us'])} | "
            f"{_cell(row['common_accept_p50_us'])} |"
        )
    table: dict[tuple[str, str], dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        for engine in engines:
            result = row["engines"][engine]
            cell = table[(row["vocabulary"], row["subset"])][engine]
            cell.append(2 if passing(result) else 1 if "ttfm_ms" in result else 0)
    lines += [
        "",
        "Per subset: compiled / passing of schemas.",
        "",
        "| vocabulary | subset | schemas | " + " | ".join(engines) + " |",
        "|" + "---|" * (3 + len(engines)),
    ]
    for (vocabulary, subset), cells in sorted(table.items()):
        count = len(cells[engines[0]])
        values = [f"{sum(v > 0 for v in cells[e])} / {cells[e].count(2)}" for e in engines]
        lines.append(f"| {vocabulary} | {subset} | {count} | " + " | ".join(values) + " |")
    return "\n".join(lines) + "\n"


def parse_arguments(arguments: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.maskbench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--data", type=Path, default=DATA, help="folder of MaskBench files (tests/data/maskbench)"
    )
    parser.add_argument(
        "--vocabularies",
        type=lambda text: _names(text, ALL_VOCABULARIES, "vocabularies"),
        default=list(ALL_VOCABULARIES),
        help="comma-separated subset of: llama-bpe,smollm2 (default: both)",
    )
    parser.add_argument(
        "--engines",
        type=lambda text: _names(text, ALL_ENGINES, "engines"),
        default=list(ALL_ENGINES),
        help="comma-separated subset of: formline,llguidance,xgrammar (default: all)",
    )
    parser.add_argument("--limit", type=int, default=None, help="at most N schemas")
    parser.add_argument("--sample", type=int, default=1, help="every K-th file (sorted names)")
    parser.add_argument("--timeout", type=float, default=10.0, help="compile limit, s (10)")
    parser.add_argument(
        "--walk-timeout", type=float, default=60.0, help="limit for walking all instances, s (60)"
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=ROOT / "bench" / "results" / "maskbench.json",
        help="JSON output; the Markdown summary goes next to it with a .md suffix",
    )
    options = parser.parse_args(arguments)
    if options.sample < 1 or (options.limit is not None and options.limit < 1):
        parser.error("--sample and --limit must be at least 1")
    if not options.data.is_dir():
        parser.error(f"--data {options.data} is not a folder")
    if not any(options.data.glob("*.json")):
        parser.error(f"no *.json MaskBench files in {options.data}; pass --data DIR")
    return options


def run_vocabulary(
    vocabulary_name: str, files: list[Path], options: argparse.Namespace
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """Every file's schema on every engine with one vocabulary, each engine in its worker
    process: the vocabulary's description, a row per file, and each worker's record."""
    progress(f"{vocabulary_name}: loading the tokenizer, starting the engines ...")
    description, tokenizer, token_bytes = vocabulary_setup(vocabulary_name)
    description["roundtrip_problems"] = []
    rows: list[dict[str, Any]] = []
    pool = {name: Worker(name, description) for name in options.engines}
    for position, path in enumerate(files, 1):
        document = json.loads(path.read_text(encoding="utf-8"))
        job, problems = make_job(document, tokenizer, token_bytes, description["eos_id"])
        description["roundtrip_problems"] += [f"{path.name} {text}" for text in problems]
        # The engines take turns to go first: a compile pays for what ran just before it
        # (formline's TTFM was 0.23-0.28 ms over its own alone when it always followed
        # XGrammar's walk of the schema before), so each engine gets each place equally.
        names = list(pool)
        turn = (position - 1) % len(names)
        results = {
            name: pool[name].run(job, options.timeout, options.walk_timeout)
            for name in names[turn:] + names[:turn]
        }
        rows.append(
            {
                "file": path.name,
                "subset": subset_of(path.name),
                "vocabulary": vocabulary_name,
                "instances": len(job["instances"]),
                "engines": {name: results[name] for name in names},
            }
        )
        cells = "; ".join(progress_cell(name, results[name]) for name in pool)
        progress(f"[{position}/{len(files)}] {vocabulary_name} {path.name}: {cells}")
    workers: dict[str, dict[str, Any]] = {}
    for name, worker in pool.items():
        if worker.process is not None:
            worker.conn.send(None)
        worker.stop()
        workers[f"{name}/{vocabulary_name}"] = {
            **worker.info,
            "setup_error": worker.setup_error,
            "restarts": worker.restarts,
        }
    return description, rows, workers


def summarize_timings(rows: list[dict[str, Any]]) -> None:
    """Replace each result's raw timings by their summaries (the raw ones stay out of the
    JSON)."""
    for row in rows:
        for result in row["engines"].values():
            for name in ("mask_ns", "accept_ns", "first_walk_mask_ns"):
                values = result.pop(name, [])
                result[name.replace("_ns", "_us")] = {
                    "count": len(values),
                    "p50": _percentile_us(values, 50),
                    "p99": _percentile_us(values, 99),
                    "over_500": sum(value > 500_000 for value in values),
                    "max": max(values) / 1e3 if values else None,
                }


def write_report(report: dict[str, Any], output: Path, table: str, data: Path) -> None:
    """``report`` as JSON at ``output`` and its tables as Markdown beside it."""
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    machine = report["machine"]
    versions = ", ".join(
        sorted(
            {
                f"{key.split('/')[0]} {value.get('version', '?')}"
                for key, value in report["workers"].items()
            }
        )
    )
    output.with_suffix(".md").write_text(
        f"# MaskBench\n\n`{report['command']}`: {report['files']} schemas from `{data}` on "
        f"{machine['cpu_model']} ({machine['cpu_count']} cores), Python {machine['python']}, "
        f"{report['elapsed_s']:.0f} s; {versions}.\n\n" + table
    )
    progress(f"wrote {output} and its .md in {report['elapsed_s']:.0f} s")


def main(arguments: list[str] | None = None) -> int:
    options = parse_arguments(arguments)
    files = select_files(options.data, options.sample, options.limit)
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    vocabularies: dict[str, dict[str, Any]] = {}
    workers: dict[str, dict[str, Any]] = {}
    for vocabulary_name in options.vocabularies:
        description, vocabulary_rows, vocabulary_workers = run_vocabulary(
            vocabulary_name, files, options
        )
        vocabularies[vocabulary_name] = description
        rows += vocabulary_rows
        workers |= vocabulary_workers
    summaries = [
        summarize(rows, engine, vocabulary, options.engines)
        for vocabulary in options.vocabularies
        for engine in options.engines
    ]
    table = markdown(summaries, rows, options.engines)
    print(table)
    summarize_timings(rows)
    report: dict[str, Any] = {
        "command": " ".join(["python -m bench.maskbench", *(arguments or sys.argv[1:])]),
        "data": _shown(options.data),
        "files": len(files),
        "elapsed_s": time.perf_counter() - started,
        "machine": machine_info(),
        "workers": workers,
        "options": {
            "timeout_s": options.timeout,
            "walk_timeout_s": options.walk_timeout,
            "engines": {name: ENGINES[name].options for name in options.engines},
        },
        "vocabularies": vocabularies,
        "summary": summaries,
        "schemas": rows,
    }
    write_report(report, options.output, table, options.data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
