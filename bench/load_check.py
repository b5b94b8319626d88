"""Load check of ``formline serve``: N concurrent ``openai`` clients for T seconds.

Run from the repository root::

    python -m bench.load_check --clients 8 --seconds 60 [--url http://127.0.0.1:8000/v1]
        [--max-tokens 48] [--threads 1] [--json bench/results/load_check.json]

Without ``--url`` it starts ``formline serve`` (the embedded SmolLM2, llama.cpp, ``--threads``
CPU threads) on a free loopback port as a subprocess, and stops it at the end. Each client
loops: one chat completion with a JSON Schema ``response_format`` (three schemas in turn,
sampled with a per-request seed), validated with ``jsonschema``. Reports requests served,
latency p50/p99 (seconds, from the client), errors (goal 0) and the share of responses that
parse and validate (goal 100%). Exits 1 when any request failed or any response was invalid.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import jsonschema

SCHEMAS: list[tuple[str, dict[str, Any]]] = [
    (
        "Invent a person.",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 30},
                "age": {"type": "integer", "minimum": 0, "maximum": 120},
            },
            "required": ["name", "age"],
            "additionalProperties": False,
        },
    ),
    (
        "Is 'I love it' positive or negative?",
        {
            "type": "object",
            "properties": {
                "label": {"enum": ["positive", "negative", "neutral"]},
                "confidence": {"type": "number", "minimum": 0, "maximum": 1},
            },
            "required": ["label", "confidence"],
            "additionalProperties": False,
        },
    ),
    (
        "List two fruits.",
        {
            "type": "object",
            "properties": {
                "fruits": {
                    "type": "array",
                    "items": {"type": "string", "maxLength": 20},
                    "minItems": 1,
                    "maxItems": 3,
                }
            },
            "required": ["fruits"],
            "additionalProperties": False,
        },
    ),
]


class Tally:
    """Latencies and outcomes, shared by the client threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latencies: list[float] = []
        self.valid = 0
        self.invalid: list[str] = []
        self.errors: list[str] = []

    def add(self, seconds: float, problem: str | None, error: str | None) -> None:
        with self.lock:
            if error is not None:
                self.errors.append(error)
                return
            self.latencies.append(seconds)
            if problem is None:
                self.valid += 1
            else:
                self.invalid.append(problem)


def one_request(client: Any, model: str, index: int, max_tokens: int) -> str | None:
    """One schema-constrained request; ``None`` when the answer validates, else why not."""
    prompt, schema = SCHEMAS[index % len(SCHEMAS)]
    response = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema, "strict": True},
        },
        max_tokens=max_tokens,
        temperature=0.7,
        seed=index,
    )
    choice = response.choices[0]
    if choice.finish_reason != "stop":
        return f"finish_reason {choice.finish_reason}: {choice.message.content!r}"
    try:
        jsonschema.validate(json.loads(choice.message.content), schema)
    except (json.JSONDecodeError, jsonschema.ValidationError) as error:
        return f"{type(error).__name__}: {str(error)[:200]}"
    return None


def client_loop(url: str, model: str, worker: int, stop_at: float, args: Any, tally: Tally) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300)
    index = worker * 1_000_000
    while time.monotonic() < stop_at:
        started = time.perf_counter()
        try:
            problem = one_request(client, model, index, args.max_tokens)
        except Exception as error:  # every failure counts as an error, none stops the check
            tally.add(0.0, None, f"{type(error).__name__}: {str(error)[:200]}")
        else:
            tally.add(time.perf_counter() - started, problem, None)
        index += 1


def start_server(threads: int) -> tuple[subprocess.Popen[bytes], str]:
    """``formline serve`` on a free loopback port; returns the process and its /v1 URL.

    Raises:
        RuntimeError: it did not answer /health within 60 s.
    """
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "formline.cli.main", "serve", "--port", str(port)]
    command += ["--threads", str(threads), "--log-level", "warning"]
    process = subprocess.Popen(command)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return process, f"http://127.0.0.1:{port}/v1"
        except OSError:
            if process.poll() is not None:
                break
            time.sleep(0.2)
    process.terminate()
    raise RuntimeError("formline serve did not start")


def percentile(values: list[float], share: float) -> float:
    """The nearest-rank percentile of ``values`` (0.0 when empty)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


def summary(tally: Tally, args: Any, seconds: float) -> dict[str, Any]:
    served = len(tally.latencies)
    return {
        "clients": args.clients,
        "seconds": round(seconds, 1),
        "requests_served": served,
        "requests_per_second": round(served / seconds, 2) if seconds else 0.0,
        "latency_p50_s": round(percentile(tally.latencies, 0.50), 3),
        "latency_p99_s": round(percentile(tally.latencies, 0.99), 3),
        "errors": len(tally.errors),
        "valid": tally.valid,
        "valid_share": round(tally.valid / served, 4) if served else 0.0,
        "first_errors": tally.errors[:5],
        "first_invalid": tally.invalid[:5],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--url", help="a running server's /v1 URL (default: start one)")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1, help="model threads (own server)")
    parser.add_argument("--json", help="also write the summary to this file")
    args = parser.parse_args(argv)
    process, url = (None, args.url) if args.url else start_server(args.threads)
    try:
        from openai import OpenAI

        model = OpenAI(base_url=url, api_key="unused").models.list().data[0].id
        tally, started = Tally(), time.monotonic()
        stop_at = started + args.seconds
        workers = [
            threading.Thread(target=client_loop, args=(url, model, n, stop_at, args, tally))
            for n in range(args.clients)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        result = summary(tally, args, time.monotonic() - started)
    finally:
        if process is not None:
            process.terminate()
            process.wait(timeout=30)
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0 if result["errors"] == 0 and not tally.invalid else 1


if __name__ == "__main__":
    sys.exit(main())
