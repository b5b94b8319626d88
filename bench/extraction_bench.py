"""Extraction quality on extraction-dev: free vs constrained vs constrained + repair, and
whether constraint pressure predicts a wrong field.

Run from the repository root (one model job at a time on 2 cores)::

    python -m bench.extraction_bench [--tasks N] [--modes free,constrained,repair]
        [--output bench/results/extraction.json]

Per mode: raw output parses (strict), parses after stripping Markdown fences, validates,
per-field accuracy and all-fields-correct (the task set's scoring rules,
:mod:`formline.evaluation.scoring`). Pressure: for every scored field of every constrained
output, the largest probability mass the mask removed while the field was written; how well
it predicts that the field is wrong is reported as AUROC, and as precision and recall at the
default flag threshold (0.5).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench.core_bench import machine_info
from formline.evaluation.confidence import auroc
from formline.evaluation.dataset import extraction_dev_directory
from formline.evaluation.runner import is_valid, load_tasks

ROOT = Path(__file__).resolve().parent.parent
EXTRACTION = extraction_dev_directory()
MODES = ("free", "constrained", "repair")


def field_score(pressure: dict[str, Any], field: str, attribute: str = "max_removed") -> float:
    """The largest removed mass on ``field`` or anything under it (``items[2].total``)."""
    values = [
        getattr(entry, attribute)
        for path, entry in pressure.items()
        if path == field or path.startswith((field + ".", field + "["))
    ]
    return max(values, default=0.0)


def run_task(task: dict[str, Any], mode: str, backend: Any, max_tokens: int) -> dict[str, Any]:
    from formline.evaluation.scoring import parse_output, score_task
    from formline.pipeline.generate import generate

    schema = task["schema_json"]
    prompt = f"{task['instruction']}\n\n{task['text']}"
    started = time.perf_counter()
    record: dict[str, Any] = {"id": task["id"], "mode": mode}
    if mode == "repair":
        from formline.pipeline.extract import Failed, extract

        outcome = extract(task["text"], schema, backend, instruction=task["instruction"])
        last = outcome.attempts[-1]
        text = last.text
        record["attempts"] = len(outcome.attempts)
        record["failed"] = isinstance(outcome, Failed)
        pressure: dict[str, Any] = {}
    else:
        # Free decoding describes the schema (the model has nothing else to go by); the
        # constrained mode uses generate's measured defaults (no description).
        free = mode == "free"
        result = generate(
            prompt, schema, backend, max_tokens=max_tokens, free=free, describe_schema=free
        )
        text, pressure = result.text, result.pressure
        record["finish_reason"] = result.finish_reason
        record["tokens"] = result.usage["completion_tokens"]
    value, strict, lenient = parse_output(text)
    if record.get("failed"):
        value = None  # a Failed gives the caller no value, whatever its last text held
    record.update(text=text, strict=strict, lenient=lenient, seconds=time.perf_counter() - started)
    record["valid"] = value is not None and is_valid(schema, value)
    record["scores"] = score_task(task, value)
    record["pressure"] = {field: field_score(pressure, field) for field in record["scores"]}
    record["content_pressure"] = {
        field: field_score(pressure, field, "content_max_removed") for field in record["scores"]
    }
    return record


def pressure_evaluation(
    records: list[dict[str, Any]], threshold: float, key: str = "pressure"
) -> dict[str, Any]:
    scores, labels = [], []
    for record in records:
        for field, correct in record["scores"].items():
            scores.append(record[key][field])
            labels.append(not correct)
    flagged = [score >= threshold for score in scores]
    true_positive = sum(f and w for f, w in zip(flagged, labels, strict=True))
    return {
        "fields": len(scores),
        "wrong": sum(labels),
        "flagged": sum(flagged),
        # P(a wrong field's pressure > a right one's): wrong plays the part of "right".
        "auroc": auroc(scores, labels),
        "precision": true_positive / sum(flagged) if any(flagged) else None,
        "recall": true_positive / sum(labels) if any(labels) else None,
        "threshold": threshold,
    }


def summarize_mode(tasks: list[dict[str, Any]], records: list[dict[str, Any]]) -> dict[str, Any]:
    from formline.evaluation.scoring import summarize

    by_id = {task["id"]: task for task in tasks}
    summary = summarize([(by_id[record["id"]], record["scores"]) for record in records])
    count = len(records)
    summary["strict_parse"] = sum(r["strict"] for r in records) / count
    summary["lenient_parse"] = sum(r["lenient"] for r in records) / count
    summary["valid"] = sum(r["valid"] for r in records) / count
    summary["seconds_per_task"] = sum(r["seconds"] for r in records) / count
    return summary


def markdown(summaries: dict[str, Any], pressure: dict[str, Any] | None) -> str:
    lines = [
        "| mode | parses (raw) | parses (fences stripped) | valid | all fields correct | "
        "s per task |",
        "|---|---|---|---|---|---|",
    ]
    for mode, summary in summaries.items():
        overall = summary["all_fields_correct"]["overall"]
        lines.append(
            f"| {mode} | {summary['strict_parse']:.0%} | {summary['lenient_parse']:.0%} | "
            f"{summary['valid']:.0%} | {overall['correct']}/{overall['total']} | "
            f"{summary['seconds_per_task']:.2f} |"
        )
    fields = sorted(
        {field for summary in summaries.values() for field in summary["field_accuracy"]}
    )
    lines += ["", "| field | " + " | ".join(summaries) + " |", "|---|" + "---|" * len(summaries)]
    for field in fields:
        cells = []
        for summary in summaries.values():
            entry = summary["field_accuracy"].get(field)
            cells.append(
                f"{entry['accuracy']:.0%}" if entry and entry["accuracy"] is not None else ""
            )
        lines.append(f"| {field} | " + " | ".join(cells) + " |")
    if pressure:
        lines += [
            "",
            "Pressure as a predictor of a wrong field (constrained outputs): "
            f"AUROC {_number(pressure['auroc'])}, precision {_number(pressure['precision'])} "
            f"and recall {_number(pressure['recall'])} at threshold {pressure['threshold']} "
            f"({pressure['flagged']} flagged of {pressure['fields']} fields, "
            f"{pressure['wrong']} wrong).",
            "Counting only steps where the model preferred content (a letter or digit): "
            f"AUROC {_number(pressure['content']['auroc'])}, precision "
            f"{_number(pressure['content']['precision'])} and recall "
            f"{_number(pressure['content']['recall'])} "
            f"({pressure['content']['flagged']} flagged).",
        ]
    return "\n".join(lines) + "\n"


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def main(arguments: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=None, help="first N tasks of each type")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--threshold", type=float, default=0.5)
    parser.add_argument("--output", default=str(ROOT / "bench" / "results" / "extraction.json"))
    options = parser.parse_args(arguments)
    from formline.backends import load_backend

    backend = load_backend("llama_cpp", n_threads=1)
    tasks = load_tasks(EXTRACTION / "tasks.jsonl", options.tasks)
    modes = [mode for mode in options.modes.split(",") if mode]
    records: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    started = time.perf_counter()
    for index, task in enumerate(tasks, 1):
        for mode in modes:
            records[mode].append(run_task(task, mode, backend, options.max_tokens))
        print(f"[{index}/{len(tasks)}] {task['id']}", file=sys.stderr, flush=True)
    summaries = {mode: summarize_mode(tasks, records[mode]) for mode in modes}
    pressure = None
    if "constrained" in records:
        pressure = pressure_evaluation(records["constrained"], options.threshold)
        pressure["content"] = pressure_evaluation(
            records["constrained"], options.threshold, "content_pressure"
        )
    output = Path(options.output)
    output.write_text(
        json.dumps(
            {
                "machine": machine_info(),
                "seconds": time.perf_counter() - started,
                "summaries": summaries,
                "pressure": pressure,
                "records": records,
            },
            indent=1,
            default=str,
        )
    )
    table = markdown(summaries, pressure)
    output.with_suffix(".md").write_text(
        f"`python -m bench.extraction_bench`: {len(tasks)} tasks, embedded SmolLM2 on llama.cpp "
        f"(greedy, one thread), {time.perf_counter() - started:.0f} s.\n\n{table}"
    )
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
