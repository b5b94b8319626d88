"""Load check of ``formline serve``: N concurrent ``openai`` clients for T seconds.

Run from the repository root::

    python -m bench.load_check --clients 8 --seconds 60 [--url http://127.0.0.1:8000/v1]
        [--max-tokens 48] [--threads 1] [--json bench/results/load_check.json]

Without ``--url`` it starts ``formline serve`` (the embedded SmolLM2, llama.cpp, ``--threads``
CPU threads) on a free loopback port as a subprocess, and stops it at the end. Each client
loops: one chat completion with a JSON Schema ``response_format`` (three schemas in turn,
sampled with a per-request seed), validated with ``jsonschema``. Reports requests served,
latency p50/p99 (seconds, from the client), errors (goal 0) and the share of responses that
parse and validate, and the invalid ones the server did not flag (goal 0). Exits 1 when any
request failed or any invalid response was not flagged (``formline_errors``).

``--hostile`` adds one more client that sends small hostile schemas in a loop (huge counts,
deep nesting, exponential patterns, 4,400-digit bounds, malformed fields): each must get
its expected status (400, or 200 for one that now compiles), and the other clients must see
no error meanwhile. One of
the regular schemas is a ``oneOf`` whose branches overlap (closing its objects would change
what it accepts): its answers are validated against the client's own schema too.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
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
    (
        "Give a JSON object with an integer a.",
        {
            "oneOf": [
                {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"type": "object", "properties": {"b": {"type": "integer"}}},
            ]
        },
    ),
]


def hostile_bodies(model: str) -> list[tuple[str, bytes, int]]:
    """Small request bodies that once froze or crashed the server (issue 15), as raw JSON
    (a 4,400-digit integer cannot go through ``json.dumps``), with the status each must get:
    400, or 200 for 20 nested arrays, which once took 12 s to compile and now compile."""
    deep: dict[str, Any] = {"type": "integer"}
    for _ in range(20):
        deep = {"type": "array", "items": deep}
    schemas = {
        "maxProperties 1e9": ({"type": "object", "maxProperties": 1_000_000_000}, 400),
        "20 nested arrays": (deep, 200),
        "exponential pattern": ({"type": "string", "pattern": "^(a|b)*a(a|b){20}$"}, 400),
        "maxItems 1e9": ({"type": "array", "items": {"type": "object"}, "maxItems": 10**9}, 400),
        "4,400-digit bound": ({"type": "integer", "minimum": "DIGITS"}, 400),
    }
    message = [{"role": "user", "content": "hi"}]
    bodies = []
    for name, (schema, status) in schemas.items():
        body = {
            "model": model,
            "messages": message,
            "max_tokens": 8,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": schema, "strict": True},
            },
        }
        text = json.dumps(body).replace('"DIGITS"', "9" * 4400)
        bodies.append((name, text.encode(), status))
    for name, body in (
        ("role as a list", {"model": model, "messages": [{"role": [], "content": ""}]}),
        ("negative seed", {"model": model, "messages": message, "seed": -1}),
        ("tools: 5", {"model": model, "messages": message, "tools": 5}),
    ):
        bodies.append((name, json.dumps(body).encode(), 400))
    return bodies


def hostile_loop(url: str, model: str, stop_at: float, outcomes: list[tuple[str, bool]]) -> None:
    """Send :func:`hostile_bodies` until ``stop_at``; record each as (line, as expected)."""
    base = url.removesuffix("/v1")
    while time.monotonic() < stop_at:
        for name, body, expected in hostile_bodies(model):
            request = urllib.request.Request(
                f"{base}/v1/chat/completions", body, {"Content-Type": "application/json"}
            )
            started = time.perf_counter()
            try:
                with urllib.request.urlopen(request, timeout=300) as response:
                    status = response.status
            except urllib.error.HTTPError as error:
                status = error.code
            except OSError as error:
                status = -1
                name = f"{name} ({type(error).__name__})"
            line = f"{name}: {status} in {time.perf_counter() - started:.2f} s"
            outcomes.append((line, status == expected))


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
    flagged = bool((choice.model_extra or {}).get("formline_errors"))
    if choice.finish_reason != "stop" and not flagged:
        return f"finish_reason {choice.finish_reason}: {choice.message.content!r}"
    try:
        jsonschema.validate(json.loads(choice.message.content), schema)
    except (json.JSONDecodeError, jsonschema.ValidationError) as error:
        where = "flagged" if flagged else "UNFLAGGED"
        return f"{where} {type(error).__name__}: {str(error)[:200]}"
    return "flagged but valid" if flagged else None


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
        "unflagged_invalid": sum("UNFLAGGED" in problem for problem in tally.invalid),
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
    parser.add_argument("--hostile", action="store_true", help="one more client, hostile")
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
        hostile: list[tuple[str, bool]] = []
        if args.hostile:
            workers.append(
                threading.Thread(target=hostile_loop, args=(url, model, stop_at, hostile))
            )
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        result = summary(tally, args, time.monotonic() - started)
        if args.hostile:
            result["hostile_requests"] = len(hostile)
            result["hostile_unexpected"] = [line for line, expected in hostile if not expected]
            result["hostile_first_round"] = [line for line, _ in hostile[:8]]
    finally:
        if process is not None:
            process.terminate()
            process.wait(timeout=30)
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    # An answer the grammar could not make valid (oneOf's exclusivity is checked after) is
    # acceptable when flagged; an invalid answer passed as fine is not.
    hostile_ok = not result.get("hostile_unexpected")
    return 0 if result["errors"] == 0 and not result["unflagged_invalid"] and hostile_ok else 1


if __name__ == "__main__":
    sys.exit(main())
