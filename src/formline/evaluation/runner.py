"""Run the variants of the free-vs-constrained experiment over a task set and score them.

Tasks follow the extraction-dev format (``id``, ``type``, ``schema``, ``instruction``,
``text``, ``gold``; schemas in ``schemas/`` next to the tasks file). Every task is decoded
once per variant on the same backend; the output is parsed and scored with
:mod:`formline.evaluation.scoring` (the task set's rules, implemented once), validated against
the task's original schema, and timed. :func:`summarize_variant` turns one variant's records
into the rows of the results table.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tqdm import tqdm

from formline.evaluation.confidence import confidence_aurocs, field_signals
from formline.evaluation.scoring import (
    field_value,
    parse_output,
    score_task,
    summarize,
    task_types,
)
from formline.evaluation.variants import Variant
from formline.jsonl import mend_torn_end, read_numbered
from formline.mask.compiler import clear_memory_cache
from formline.pipeline.extract import Failed, extract
from formline.pipeline.generate import generate
from formline.pipeline.tolerance import coerce_numbers
from formline.schema import compile_schema
from formline.schema.api import SchemaCheck

PREDICTION_KEYS = (
    "id", "variant", "output", "value", "finish_reason", "tokens", "seconds", "rationale",
    "coerced",
)  # fmt: skip
RECORDS_FILE = "records.jsonl"  # every record as it is made: a rerun resumes from it


TASK_KEYS = ("id", "type", "schema", "instruction", "text", "gold")


def load_tasks(path: str | Path, limit: int | None = None) -> list[dict[str, Any]]:
    """The tasks of a JSON Lines file, each with its schema loaded as ``schema_json`` from
    ``schemas/<schema>`` next to the file. ``limit`` keeps the first N tasks of each type.
    Every task is checked here, before a model loads.

    Raises:
        OSError: the file is missing.
        ValueError: naming the file and line (or the schema file) of a line that is not a
            JSON object, lacks one of :data:`TASK_KEYS`, has a type the scoring rules do not
            know, or names a schema that is missing or not JSON.
    """
    path = Path(path)
    tasks = [_checked_task(path, number, task) for number, task in read_numbered(path)]
    if limit is not None:
        seen: dict[str, int] = {}
        kept = []
        for task in tasks:
            seen[task["type"]] = seen.get(task["type"], 0) + 1
            if seen[task["type"]] <= limit:
                kept.append(task)
        tasks = kept
    schemas: dict[str, Any] = {}
    for task in tasks:
        name = task["schema"]
        if name not in schemas:
            schemas[name] = _task_schema(path.parent / "schemas" / name, task["id"])
        task["schema_json"] = schemas[name]
    return tasks


def _checked_task(path: Path, number: int, task: Any) -> dict[str, Any]:
    where = f"{path}:{number}"
    if not isinstance(task, dict):
        raise ValueError(f"{where}: a task must be a JSON object")
    missing = [key for key in TASK_KEYS if key not in task]
    if missing:
        raise ValueError(f"{where}: the task has no {', '.join(missing)}")
    if task["type"] not in task_types():
        known = ", ".join(sorted(task_types()))
        raise ValueError(f"{where}: no scoring rules for type {task['type']!r} (known: {known})")
    return task


def _task_schema(path: Path, task_id: Any) -> Any:
    try:
        return json.loads(path.read_text("utf-8"))
    except OSError as error:
        raise ValueError(f"task {task_id!r}: cannot read its schema {path}: {error}") from error
    except ValueError as error:
        raise ValueError(f"task {task_id!r}: its schema {path} is not JSON: {error}") from error


def is_valid(schema: dict[str, Any], value: Any) -> bool:
    """Whether ``value`` passes ``schema`` as formline's after-check reads it (its draft,
    formats checked, patterns as ECMA-262: :class:`~formline.schema.api.SchemaCheck`)."""
    return not SchemaCheck(schema).check(value)


def run_task(
    task: dict[str, Any], variant: Variant, backend: Any, max_tokens: int
) -> dict[str, Any]:
    """Decode one task under one variant: the prediction record plus the internal
    measurements (parse flags, validity, field scores, timings, passes)."""
    schema = task["schema_json"]
    decoding = variant.decoding_schema(schema)
    started = time.perf_counter()
    if variant.mode == "repair":
        record = _run_repair(task, variant, decoding, backend, max_tokens)
    else:
        record = _run_generate(task, variant, decoding, backend, max_tokens)
    record["seconds"] = time.perf_counter() - started
    parsed, strict, lenient = parse_output(record["output"])
    value = variant.finish(parsed, schema) if lenient and not record.get("failed") else None
    if lenient and variant.numbers == "tolerant":
        value, _ = coerce_numbers(value, schema)
    record.update(id=task["id"], variant=variant.name, value=value, max_tokens=max_tokens)
    record.update(strict=strict, lenient=lenient)
    record["valid"] = lenient and value is not None and is_valid(schema, value)
    record["scores"] = score_task(task, value)
    pressure = record.pop("pressure", None)
    if pressure:
        record["signals"] = {
            field: field_signals(
                pressure, field, field_value(value, field), task["text"], variant.verbatim
            )
            for field in record["scores"]
        }
    return record


def _run_generate(
    task: dict[str, Any], variant: Variant, schema: dict[str, Any], backend: Any, max_tokens: int
) -> dict[str, Any]:
    result = generate(
        variant.prompt(task, schema),
        schema,
        backend,
        max_tokens=max_tokens,
        free=variant.mode == "free",
        source=task["text"],  # what verbatim narrows to: the text, not the instruction
        **variant.generation_options(),
    )
    return {
        "output": result.text,
        "rationale": result.rationale,
        "coerced": result.coerced,
        "finish_reason": result.finish_reason,
        "tokens": result.usage["completion_tokens"],
        "forward_passes": result.usage["forward_passes"],
        "passes_saved": result.usage["forward_passes_saved"],
        "forward_seconds": result.timings["forward_seconds"],
        "mask_seconds": result.timings["mask_seconds"],
        "compile_seconds": result.timings["compile_seconds"],
        "pressure": result.pressure,  # turned into per-field signals once scored
    }


def _run_repair(
    task: dict[str, Any], variant: Variant, schema: dict[str, Any], backend: Any, max_tokens: int
) -> dict[str, Any]:
    outcome = extract(
        task["text"],
        schema,
        backend,
        instruction=None if variant.generic_instruction else task["instruction"],
        max_tokens=max_tokens,
        describe_schema=variant.describe_schema,
        verbatim=variant.verbatim,
    )
    last = outcome.attempts[-1]  # the accepted one, or the last rejected
    return {
        "output": last.text,
        "finish_reason": last.finish_reason,
        "tokens": sum(attempt.completion_tokens for attempt in outcome.attempts),
        "attempts": len(outcome.attempts),
        # A Failed gives its caller no value: scored as none (every field wrong, not valid),
        # whatever its last rejected text holds.
        "failed": outcome.reason if isinstance(outcome, Failed) else None,
    }


def compile_times(variants: Iterable[Variant], tasks: list[dict[str, Any]], backend: Any) -> Any:
    """Per variant: mean cold compile seconds of its schemas (memory cache cleared, disk
    cache off; includes the vocabulary's token index) and mean cached compile seconds (the
    same compile again, from the same cache: a memory hit). Free variants compile too (the
    after-check). The second compile must name the same disk setting: each setting has its
    own process-wide cache, and the other one's hit (a disk load plus the vocabulary's
    token index, about 33 ms on SmolLM2) read here as a 30-45 ms "cached" compile."""
    schemas = {task["schema"]: task["schema_json"] for task in tasks}
    times: dict[str, dict[str, float]] = {}
    for variant in variants:
        cold, cached = [], []
        for schema in schemas.values():
            decoding = variant.decoding_schema(schema)
            clear_memory_cache()
            started = time.perf_counter()
            compile_schema(decoding, backend.vocabulary, disk_cache=False)
            cold.append(time.perf_counter() - started)
            started = time.perf_counter()
            compile_schema(decoding, backend.vocabulary, disk_cache=False)
            cached.append(time.perf_counter() - started)
        times[variant.name] = {
            "compile_cold_seconds": statistics.fmean(cold),
            "compile_cached_seconds": statistics.fmean(cached),
        }
    return times


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator else None


def _share(records: list[dict[str, Any]], key: str) -> float:
    return sum(bool(record[key]) for record in records) / len(records)


def summarize_variant(tasks: list[dict[str, Any]], records: list[dict[str, Any]]) -> Any:
    """The table rows of one variant: parse and validity rates, the scoring summary
    (:func:`formline.evaluation.scoring.summarize`), tokens, latency, mask share, passes saved.
    Timing rows are ``None`` where the mode does not report them (repair)."""
    by_id = {task["id"]: task for task in tasks}
    summary: dict[str, Any] = summarize([(by_id[r["id"]], r["scores"]) for r in records])
    tokens = sum(record["tokens"] for record in records)
    forward = sum(record.get("forward_seconds", 0.0) for record in records)
    mask = sum(record.get("mask_seconds", 0.0) for record in records)
    seconds = sum(record["seconds"] for record in records)
    fields = [ok for record in records for ok in record["scores"].values()]
    summary.update(
        strict_parse=_share(records, "strict"),
        lenient_parse=_share(records, "lenient"),
        valid=_share(records, "valid"),
        fields_correct=_ratio(sum(fields), len(fields)),
        finish_length=sum(record["finish_reason"] == "length" for record in records),
        tokens_per_task=tokens / len(records),
        seconds_per_task=seconds / len(records),
        seconds_total=seconds,
        ms_per_token=_ratio(1000 * seconds, tokens),
    )
    if any("forward_seconds" in record for record in records):  # repair: n/a
        summary["decode_ms_per_token"] = _ratio(1000 * (forward + mask), tokens)
    if mask > 0:  # free and repair: n/a
        saved = sum(record["passes_saved"] for record in records)
        summary.update(
            mask_ms_per_token=_ratio(1000 * mask, tokens),
            mask_share=_ratio(mask, forward + mask),
            passes_saved=saved,
            passes_saved_share=_ratio(saved, tokens),
        )
    if any("signals" in record for record in records):
        summary["confidence_auroc"] = confidence_aurocs(records)
    if any("attempts" in record for record in records):
        summary["attempts_per_task"] = _ratio(sum(r["attempts"] for r in records), len(records))
        summary["failed"] = sum(bool(record.get("failed")) for record in records)
    return summary


def prediction(record: dict[str, Any]) -> dict[str, Any]:
    """The public part of a record: one line of predictions.jsonl."""
    return {key: record.get(key) for key in PREDICTION_KEYS}


def load_records(path: Path | None) -> dict[tuple[str, str], dict[str, Any]]:
    """The records already written to ``path`` (:data:`RECORDS_FILE`), by (task id,
    variant); a torn last line (an interrupted run) is skipped."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    if path is None or not path.exists():
        return found
    for line in path.read_text(encoding="utf-8").split("\n"):  # not at U+2028 in a string
        try:
            record = json.loads(line)
        except ValueError:
            continue
        found[(record["id"], record["variant"])] = record
    return found


def run_setting(model: str, task: dict[str, Any], variant: Variant, max_tokens: int) -> str:
    """A digest of what a record depends on: a record made with another model, budget,
    variant definition or task text, gold or schema is not reused (a resumed run over an
    ``--out`` folder of another run decodes again). Costs one JSON dump of the task."""
    made_of = {"model": model, "max_tokens": max_tokens, "variant": asdict(variant)}
    made_of["task"] = task
    text = json.dumps(made_of, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def run_all(
    tasks: list[dict[str, Any]],
    variants: list[Variant],
    backend: Any,
    max_tokens: int,
    progress: bool = True,
    records_path: Path | None = None,
    model: str = "",
) -> dict[str, list[dict[str, Any]]]:
    """Every task under every variant, task by task (a tqdm bar over task x variant).
    With ``records_path`` each record is appended there as it is made, and the records
    already there are reused (a rerun resumes) when they were made in the same setting:
    ``model`` (the model and backend, as the caller names them), ``max_tokens``, the
    variant's definition and the task's text, gold and schema. Returns variant name ->
    records in task order."""
    if records_path is not None:
        mend_torn_end(records_path)  # else the next record is glued to a torn line, and lost
    done = load_records(records_path)
    records: dict[str, list[dict[str, Any]]] = {variant.name: [] for variant in variants}
    bar = tqdm(total=len(tasks) * len(variants), disable=not progress, unit="run")
    sink = records_path.open("a", encoding="utf-8") if records_path is not None else None
    try:
        for task in tasks:
            for variant in variants:
                bar.set_postfix_str(f"{task['id']} {variant.name}", refresh=False)
                record = done.get((task["id"], variant.name))
                setting = run_setting(model, task, variant, max_tokens)
                if record is None or record.get("setting") != setting:
                    record = run_task(task, variant, backend, max_tokens)
                    record["setting"] = setting
                    if sink is not None:
                        sink.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
                        sink.flush()
                records[variant.name].append(record)
                bar.update()
    finally:
        if sink is not None:
            sink.close()
        bar.close()
    return records
