"""Write the experiment's results: predictions.jsonl, results.json, results.csv, results.md.

``results.json`` holds everything the table and the plots need (``meta`` and, per variant,
the summary rows), so ``formline eval --plot`` redraws without the model. The table is the
shape of seed 002's: one column per variant, one row per measurement.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

Row = tuple[str, Callable[[dict[str, Any]], Any], Callable[[Any], str]]


def _percent(value: Any) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def _percent1(value: Any) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _number(digits: int, unit: str = "") -> Callable[[Any], str]:
    def format_(value: Any) -> str:
        return "n/a" if value is None else f"{value:.{digits}f}{unit}"

    return format_


def _ms(seconds: Any) -> Any:
    return None if seconds is None else 1000 * seconds


def _overall(summary: dict[str, Any]) -> Any:
    return summary["all_fields_correct"]["overall"]["accuracy"]


def _saved(summary: dict[str, Any]) -> Any:
    saved, share = summary.get("passes_saved"), summary.get("passes_saved_share")
    return None if saved is None else f"{saved} ({share or 0:.0%})"


SUMMARY_ROWS: list[Row] = [
    ("raw output parses as JSON (strict)", lambda s: s["strict_parse"], _percent),
    ("parses after stripping fences", lambda s: s["lenient_parse"], _percent),
    ("validates against the schema", lambda s: s["valid"], _percent),
    ("fields correct", lambda s: s["fields_correct"], _percent1),
    ("all fields correct (tasks)", _overall, _percent1),
]


def _auroc_of(signal: str) -> Callable[[dict[str, Any]], Any]:
    """A summary's confidence AUROC for ``signal`` (``None`` when it has none)."""
    return lambda summary: (summary.get("confidence_auroc") or {}).get(signal)


COST_ROWS: list[Row] = [
    ("tokens generated (per task)", lambda s: s["tokens_per_task"], _number(1)),
    ("cut off at max tokens (tasks)", lambda s: s["finish_length"], str),
    ("wall time per task", lambda s: s["seconds_per_task"], _number(2, " s")),
    ("wall time (all tasks)", lambda s: s.get("seconds_total"), _number(0, " s")),
    *(
        (f"confidence AUROC ({label})", _auroc_of(signal), _number(2))
        for label, signal in (
            ("least likely token", "min_probability"),
            ("pressure", "pressure"),
            ("values found in the text", "grounded"),
            ("result.confidence: found 0.7, token 0.3; verbatim: token, shape", "confidence"),
        )
    ),
    ("latency per token (wall)", lambda s: s["ms_per_token"], _number(1, " ms")),
    (
        "latency per token (forward + mask)",
        lambda s: s.get("decode_ms_per_token"),
        _number(1, " ms"),
    ),
    ("mask time per token", lambda s: s.get("mask_ms_per_token"), _number(3, " ms")),
    ("mask share of the step", lambda s: s.get("mask_share"), _percent1),
    ("compile, cold", lambda s: _ms(s.get("compile_cold_seconds")), _number(1, " ms")),
    ("compile, memory hit", lambda s: _ms(s.get("compile_cached_seconds")), _number(3, " ms")),
    ("forward passes saved (jump-forward)", _saved, lambda v: "n/a" if v is None else v),
    ("repair attempts per task", lambda s: s.get("attempts_per_task"), _number(2)),
    ("repair ended in Failed, no value (tasks)", lambda s: s.get("failed"), _number(0)),
]


def field_rows(variants: dict[str, Any]) -> list[Row]:
    """One row per scored field (``type.field``), in the order of the first variant."""
    fields: dict[str, None] = {}
    for summary in variants.values():
        fields.update(dict.fromkeys(summary["field_accuracy"]))

    def row(field: str) -> Row:
        return (
            f"— {field}",
            lambda s: s["field_accuracy"].get(field, {}).get("accuracy"),
            _percent,
        )

    return [row(field) for field in fields]


def all_rows(variants: dict[str, Any]) -> list[Row]:
    return SUMMARY_ROWS + field_rows(variants) + COST_ROWS


def markdown_table(results: dict[str, Any]) -> str:
    """The results table: one column per variant."""
    variants = results["variants"]
    lines = [
        "| | " + " | ".join(variants) + " |",
        "|---|" + "---|" * len(variants),
    ]
    for label, get, format_ in all_rows(variants):
        cells = [format_(get(summary)) for summary in variants.values()]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def markdown(results: dict[str, Any]) -> str:
    """results.md: what ran, then the table and its notes."""
    meta = results["meta"]
    header = (
        f"# formline eval: {meta['model']}\n\n"
        f"Command: `{meta['command']}`\n\n"
        f"{meta['tasks']} tasks from `{meta['tasks_file']}`, backend {meta['backend']} "
        f"(greedy, max_tokens {meta['max_tokens']}), run took {meta['seconds']:.0f} s "
        f"on {meta['machine']}.\n\n"
    )
    notes = (
        "\nFields correct: of the task set's scored field instances; all fields correct: "
        "tasks whose every scored field is right (scoring rules of the task set's README, "
        "`formline.evaluation.scoring`). Latency per token (wall): task wall time over "
        "completion tokens, prompt pass included; forward + mask: the decoding loop's own "
        "timings (ms). Repair: tokens and time summed over attempts; its loop does not report "
        "forward and mask times; a task it ends in `Failed` (no value for the caller) is "
        "scored as no answer, whatever its last rejected output held. Compile: mean per "
        "schema, cold with the caches off (vocabulary token index included), memory hit the "
        "same compile again.\n"
    )
    return header + markdown_table(results) + notes


def write_csv(results: dict[str, Any], path: Path) -> None:
    """results.csv: ``metric`` then one column per variant, raw numbers."""
    variants = results["variants"]
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["metric", *variants])
        for label, get, _ in all_rows(variants):
            writer.writerow([label.lstrip("— "), *(get(s) for s in variants.values())])


def write_all(
    results: dict[str, Any], predictions: list[dict[str, Any]], directory: Path
) -> list[Path]:
    """Write the four result files under ``directory`` (created); returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / name for name in ("predictions.jsonl", "results.json")]
    with paths[0].open("w", encoding="utf-8") as handle:
        for line in predictions:
            handle.write(json.dumps(line, ensure_ascii=False) + "\n")
    paths[1].write_text(json.dumps(results, indent=1, ensure_ascii=False), encoding="utf-8")
    write_csv(results, directory / "results.csv")
    (directory / "results.md").write_text(markdown(results), encoding="utf-8")
    return [*paths, directory / "results.csv", directory / "results.md"]


def load_results(directory: Path) -> dict[str, Any]:
    """The saved results.json of a run. Raises OSError when it is missing."""
    results: dict[str, Any] = json.loads((directory / "results.json").read_text("utf-8"))
    return results
