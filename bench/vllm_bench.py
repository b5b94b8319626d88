"""vLLM benchmark: the same extraction-dev requests through vLLM with formline, with vLLM's
built-in xgrammar and guidance backends, and unconstrained, in one run.

Run in vLLM's environment (it builds it when missing)::

    python3 scripts/vllm_env.py bench [--tasks N] [--concurrency 16] [--max-tokens 400]
        [--output bench/results/vllm.json]

One vLLM OpenAI server per engine (SmolLM2-135M exported to bfloat16 safetensors, CPU,
``--enforce-eager``), started in turn; each serves the extraction-dev requests (instruction,
text and the schema described in the prompt, greedy) from ``--concurrency`` streaming
``openai`` clients. Per engine: requests, valid share, fields correct, output tokens per
second over the wall time, time to first token and time per output token (p50/p90 over
requests), and for formline the time its logits processor spent per step (its
``FORMLINE_VLLM_STATS`` file) with a least-squares fit ``fixed + per_row x rows``, from which
the batch size where the mask would exceed a 20 ms forward pass is computed.
Outputs: the JSON and ``vllm.md`` next to it. Exits 1 when a formline output is invalid.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.core_bench import ROOT, machine_info
from bench.load_check import percentile
from formline.evaluation.dataset import extraction_dev_directory

ENGINES = ("unconstrained", "formline", "xgrammar", "guidance")
SERVED = "smollm2"
FORWARD_BUDGET_SECONDS = 0.020  # the reference forward pass
DATA = extraction_dev_directory()  # the set shipped with formline (its SOURCE.md)


def server_options(engine: str) -> tuple[str, ...]:
    """The vLLM server flags of an engine (formline's processor only for formline)."""
    from formline.backends.vllm.launch import PROCESSOR

    if engine == "formline":
        return ("--logits-processors", PROCESSOR)
    if engine in ("xgrammar", "guidance"):
        return ("--structured-outputs-config", json.dumps({"backend": engine}))
    return ()


def request_extra(engine: str, schema: dict[str, Any]) -> dict[str, Any] | None:
    """The request's constraint in the engine's own field."""
    from formline.backends.vllm import vllm_xargs

    if engine == "formline":
        return {"vllm_xargs": vllm_xargs(json_schema=schema)}
    if engine in ("xgrammar", "guidance"):
        return {"structured_outputs": {"json": schema}}
    return None


def run_request(client: Any, engine: str, task: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """One streamed request: its text, finish reason, tokens, TTFT and time per token."""
    from formline.constraint import schema_description

    prompt = f"{task['instruction']}\n\n{task['text']}\n\n{schema_description(task['schema_json'])}"
    started = time.perf_counter()
    stream = client.chat.completions.create(
        model=SERVED,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=request_extra(engine, task["schema_json"]),
    )
    pieces, first, last, finish, tokens = [], None, started, None, 0
    for chunk in stream:
        now = time.perf_counter()
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        for choice in chunk.choices:
            if choice.delta.content:
                first = now if first is None else first
                last = now
                pieces.append(choice.delta.content)
            finish = choice.finish_reason or finish
    ttft = (first or last) - started
    per_token = (last - first) / (tokens - 1) if first is not None and tokens > 1 else None
    text = "".join(pieces)
    return {"id": task["id"], "text": text, "finish_reason": finish, "tokens": tokens,
            "ttft": ttft, "tpot": per_token, "seconds": time.perf_counter() - started}  # fmt: skip


def judge(task: dict[str, Any], record: dict[str, Any]) -> None:
    """Add ``valid`` and ``fields`` (extraction-dev's scoring) to a record."""
    from formline.evaluation.runner import is_valid
    from formline.evaluation.scoring import score_task

    try:
        value = json.loads(record["text"])
    except json.JSONDecodeError:
        value = None
    record["valid"] = value is not None and is_valid(task["schema_json"], value)
    record["fields"] = score_task(task, value)


def run_engine(engine: str, tasks: list[dict[str, Any]], options: Any) -> dict[str, Any]:
    from openai import OpenAI

    from formline.backends.export import exported_model_directory
    from formline.backends.vllm.launch import start_server
    from formline.vocab.fixtures import fixture_path

    model = exported_model_directory(fixture_path("smollm2"))
    work = Path(tempfile.mkdtemp(prefix=f"vllm-bench-{engine}-"))
    stats_path = work / "formline-stats.json"
    environment = {"FORMLINE_VLLM_STATS": str(stats_path)} if engine == "formline" else {}
    begun = time.perf_counter()
    server = start_server(model, work / "server.log", SERVED, server_options(engine), environment)
    startup = time.perf_counter() - begun
    try:
        client = OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=900)
        run_request(client, engine, tasks[0], 8)  # warm-up: the first request's one-off costs
        started = time.perf_counter()
        with ThreadPoolExecutor(options.concurrency) as pool:
            records = list(
                pool.map(lambda task: run_request(client, engine, task, options.max_tokens), tasks)
            )
        wall = time.perf_counter() - started
    finally:
        server.stop()  # the processor writes its last stats at exit
    for task, record in zip(tasks, records, strict=True):
        judge(task, record)
    summary = summarize(records, wall, startup)
    if engine == "formline" and stats_path.is_file():
        summary["mask"] = mask_figures(json.loads(stats_path.read_text()), wall)
    print(f"{engine}: {json.dumps(summary)}", flush=True)
    return {"summary": summary, "records": records}


def summarize(records: list[dict[str, Any]], wall: float, startup: float) -> dict[str, Any]:
    tokens = sum(record["tokens"] for record in records)
    tpots = [record["tpot"] for record in records if record["tpot"] is not None]
    ttfts = [record["ttft"] for record in records]
    fields = [ok for record in records for ok in record["fields"].values()]
    return {
        "requests": len(records),
        "valid": sum(record["valid"] for record in records) / len(records),
        "stopped": sum(record["finish_reason"] == "stop" for record in records) / len(records),
        "fields_correct": sum(fields) / len(fields) if fields else None,
        "output_tokens": tokens,
        "wall_seconds": wall,
        "tokens_per_second": tokens / wall,
        "tpot_ms_p50": 1000 * percentile(tpots, 0.5),
        "tpot_ms_p90": 1000 * percentile(tpots, 0.9),
        "ttft_ms_p50": 1000 * percentile(ttfts, 0.5),
        "server_start_seconds": startup,
    }


def mask_figures(stats: dict[str, Any], wall: float) -> dict[str, Any]:
    """The processor's cost: per step, per row (least squares), its share of the wall time,
    and the batch at which a step's mask would take FORWARD_BUDGET_SECONDS."""
    steps, rows, seconds = stats["steps"], stats["rows"], stats["seconds"]
    mean_rows = rows / steps
    spread = stats["rows_squared"] / steps - mean_rows**2
    if spread > 1e-9:
        per_row = (stats["rows_seconds"] / steps - mean_rows * seconds / steps) / spread
    else:
        per_row = seconds / rows
    fixed = max(0.0, seconds / steps - per_row * mean_rows)
    return {
        "steps": steps,
        "rows_per_step": mean_rows,
        "ms_per_step": 1000 * seconds / steps,
        "us_per_row": 1e6 * per_row,
        "us_fixed_per_step": 1e6 * fixed,
        "share_of_wall": seconds / wall,
        "batch_for_20ms": (FORWARD_BUDGET_SECONDS - fixed) / per_row if per_row > 0 else None,
    }


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "# vLLM: formline vs built-in structured outputs vs unconstrained",
        "",
        f"{results['tasks']} extraction-dev requests, {results['concurrency']} concurrent "
        f"streaming clients, max_tokens {results['max_tokens']}, greedy; vLLM "
        f"{results['vllm']} on the CPU ({results['machine']['cpu_model']}, "
        f"{results['machine']['cpus_usable']} cores), SmolLM2-135M bfloat16.",
        "",
        "| engine | valid | stopped | fields correct | tok/s | TPOT p50 ms | TPOT p90 ms "
        "| TTFT p50 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for engine, entry in results["engines"].items():
        s = entry["summary"]
        lines.append(
            f"| {engine} | {s['valid']:.0%} | {s['stopped']:.0%} | {s['fields_correct']:.1%} | "
            f"{s['tokens_per_second']:.0f} | {s['tpot_ms_p50']:.1f} | {s['tpot_ms_p90']:.1f} | "
            f"{s['ttft_ms_p50']:.0f} |"
        )
    mask = results["engines"].get("formline", {}).get("summary", {}).get("mask")
    if mask:
        lines += [
            "",
            f"formline's processor: {mask['ms_per_step']:.2f} ms per step over "
            f"{mask['steps']} steps ({mask['rows_per_step']:.1f} constrained rows on average), "
            f"fit {mask['us_fixed_per_step']:.0f} µs + {mask['us_per_row']:.0f} µs per row; "
            f"{mask['share_of_wall']:.1%} of the wall time. A step's mask would reach a 20 ms "
            f"forward pass at about {mask['batch_for_20ms']:.0f} constrained rows.",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=None, help="first N tasks (default all)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "vllm.json")
    options = parser.parse_args(argv)
    import vllm

    from formline.evaluation.runner import load_tasks

    tasks = load_tasks(options.data / "tasks.jsonl")[: options.tasks]
    results: dict[str, Any] = {
        "tasks": len(tasks),
        "concurrency": options.concurrency,
        "max_tokens": options.max_tokens,
        "vllm": vllm.__version__,
        "machine": machine_info(),
        "engines": {},
    }
    for engine in options.engines.split(","):
        results["engines"][engine] = run_engine(engine, tasks, options)
    options.output.parent.mkdir(parents=True, exist_ok=True)
    options.output.write_text(json.dumps(results, indent=1))
    report = markdown(results)
    options.output.with_suffix(".md").write_text(report)
    print(report)
    formline = results["engines"].get("formline")
    return 1 if formline is not None and formline["summary"]["valid"] < 1 else 0


if __name__ == "__main__":
    raise SystemExit(main())
