"""Hostile input never hurts the server: a batch of malformed requests is answered with 400s
naming the field (no 500), after which a plain request and ``/health`` answer at once; every
route but ``/health`` needs the API key; ``/trace`` keeps the request's time limit; a compile
never makes a text-only request wait; an answer the client's schema refuses is flagged.
Against a real running server."""

from __future__ import annotations

import threading
import time
import urllib.request
import uuid
from typing import Any

from hostile_bodies import CASES, COMPILE_CASES, RAW_BODIES, body_for
from server_tools import ask, engine_with, health, post_json

from formline.schema import compile_schema
from formline.server.app import BackgroundServer, create_app

TRACE_SCHEMA = {
    "type": "object",
    "properties": {"age": {"type": "integer"}},
    "required": ["age"],
    "additionalProperties": False,
}
TRACE_CASES: list[tuple[dict[str, Any], str]] = [
    ({"schema": TRACE_SCHEMA}, "prompt"),
    ({"prompt": "x", "schema": [1]}, "schema"),
    ({"prompt": "x", "schema": TRACE_SCHEMA, "free_samples": 1.5}, "free_samples"),
    ({"prompt": "x", "schema": TRACE_SCHEMA, "temperature": "hot"}, "temperature"),
    ({"prompt": "x", "schema": TRACE_SCHEMA, "seed": 1}, "seed"),
    ({"prompt": "x", "schema": {"type": "strnig"}}, "schema"),
]
# Every value the grammar allows matches both branches, so the client's schema refuses it.
BOTH_BRANCHES = {"oneOf": [{"const": "same"}, {"const": "same"}]}


def test_a_hostile_batch_gets_400s_and_the_server_still_answers_at_once(
    server: Any, model: str, client: Any
) -> None:
    url = f"{server.url}/v1/chat/completions"
    for label, changes, param in CASES + COMPILE_CASES:
        status, reply = post_json(url, body_for(model, changes))
        assert status == 400 and reply["error"]["param"] == param, (label, reply)
    for label, raw in RAW_BODIES:
        status, reply = post_json(url, raw)
        assert status == 400 and reply["error"]["code"] == "invalid_json", (label, reply)
    for body, param in TRACE_CASES:
        status, reply = post_json(f"{server.url}/trace", body)
        assert status == 400 and reply["error"]["param"] == param, (body, reply)
    started = time.perf_counter()
    state = health(server.url)
    assert state["busy"] is False and state["compiling"] == 0
    response = client.chat.completions.create(model=model, messages=ask("Hi"), max_tokens=2)
    assert response.choices[0].finish_reason in ("stop", "length")
    assert time.perf_counter() - started < 10


def test_every_route_but_health_needs_the_key(engine: Any) -> None:
    secured = BackgroundServer(create_app(engine, api_key="sesame")).start()
    right = {"Authorization": "Bearer sesame"}
    trace = {"prompt": "Ada is 36.", "schema": TRACE_SCHEMA, "free_samples": 0, "max_tokens": 4}
    try:
        for path, body in (("/trace", trace), ("/v1/chat/completions", {}), ("/nowhere", {})):
            status, reply = post_json(f"{secured.url}{path}", body)
            assert status == 401 and reply["error"]["code"] == "invalid_api_key", path
            wrong = {"Authorization": "Bearer sesame2"}
            assert post_json(f"{secured.url}{path}", body, wrong)[0] == 401, path
        assert health(secured.url)["status"] == "ok"  # open, for load balancers
        head = urllib.request.Request(f"{secured.url}/health", method="HEAD")
        with urllib.request.urlopen(head, timeout=10) as reply:  # HEAD was a 405
            assert reply.status == 200
        status, page = post_json(f"{secured.url}/trace", trace, right)
        assert status == 200 and page.lstrip().lower().startswith("<!doctype html")
    finally:
        secured.stop()


def test_trace_waits_for_the_model_only_until_the_deadline(engine: Any) -> None:
    compile_schema(
        TRACE_SCHEMA, engine.backend.vocabulary
    )  # the 503 is the wait's, not a compile's
    tight = BackgroundServer(create_app(engine_with(engine, request_seconds=0.5))).start()
    body = {"prompt": "Ada is 36.", "schema": TRACE_SCHEMA, "free_samples": 0, "max_tokens": 4}
    try:
        with engine.lock:  # another request holds the model
            started = time.perf_counter()
            status, reply = post_json(f"{tight.url}/trace", body)
            waited = time.perf_counter() - started
    finally:
        tight.stop()
    assert status == 503 and reply["error"]["type"] == "server_busy"
    assert 0.4 < waited < 5


def test_trace_stops_recording_at_the_deadline(engine: Any, client: Any, model: str) -> None:
    tight = BackgroundServer(create_app(engine_with(engine, request_seconds=1.0))).start()
    body = {"prompt": "Ada is 36.", "schema": TRACE_SCHEMA, "free_samples": 8, "max_tokens": 256}
    try:
        started = time.perf_counter()
        status, reply = post_json(f"{tight.url}/trace", body)
        took = time.perf_counter() - started
    finally:
        tight.stop()
    assert status == 504 and reply["error"]["code"] == "timeout", reply
    assert took < 6  # 25 recorded generations would take a minute
    assert not engine.lock.locked()
    response = client.chat.completions.create(model=model, messages=ask("Hi"), max_tokens=2)
    assert response.choices[0].finish_reason in ("stop", "length")


def slow_schema() -> dict[str, Any]:
    """A schema that takes over a second to compile in few bytes (700 optional properties
    under maxProperties 350: 1.5-3 s on an AMD EPYC; 112 enums of 2,000 words, 3.7 MB, took
    0.41 s once the disk store was off, less than the request that must finish meanwhile),
    described past the model's context, new each run (its ``tag``)."""
    properties: dict[str, Any] = {f"p{k}": {"type": "integer"} for k in range(700)}
    properties["tag"] = {"const": uuid.uuid4().hex[:8]}
    return {"type": "object", "properties": properties, "maxProperties": 350,
            "description": "a long description " * 3000}  # fmt: skip


def test_a_text_request_does_not_wait_for_a_compile(engine: Any, model: str) -> None:
    wide = engine_with(engine, max_schema_bytes=4_000_000, max_request_bytes=8_000_000)
    wide.describe_schema = "schema"  # described, the schema is over the context: a quick 400
    running = BackgroundServer(create_app(wide)).start()
    url = f"{running.url}/v1/chat/completions"
    schema_format = {"type": "json_schema", "json_schema": {"name": "s", "schema": slow_schema()}}
    slow = {"model": model, "messages": ask("Pick."), "max_tokens": 1}
    slow["response_format"] = schema_format
    results: list[tuple[int, Any]] = []
    compiling = threading.Thread(target=lambda: results.append(post_json(url, slow)))
    try:
        compiling.start()
        deadline = time.monotonic() + 30
        while health(running.url)["compiling"] < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        during = health(running.url)
        assert during["compiling"] == 1 and during["busy"] is False  # a compile holds no model
        status, reply = post_json(url, {"model": model, "messages": ask("Hi"), "max_tokens": 2})
        assert status == 200, reply
        # Answered while the compile still runs: it did not wait for it (the compile and the
        # request share the GIL, so the time it took says less than this does).
        assert health(running.url)["compiling"] == 1, "the compile ended first: inconclusive"
        compiling.join(timeout=120)
    finally:
        running.stop()
    # Described in the prompt, the schema is over the model's context: a 400 once compiled.
    assert results[0][1]["error"]["code"] == "context_length_exceeded", results


def test_an_answer_the_schema_refuses_is_flagged_not_stopped(
    server: Any, model: str, client: Any
) -> None:
    schema_format = {"type": "json_schema", "json_schema": {"name": "s", "schema": BOTH_BRANCHES}}
    body = {"model": model, "messages": ask("Say it."), "max_tokens": 8}
    status, reply = post_json(
        f"{server.url}/v1/chat/completions", {**body, "response_format": schema_format}
    )
    choice = reply["choices"][0]
    assert status == 200 and choice["message"]["content"] == '"same"'
    assert choice["finish_reason"] == "error"
    assert any("valid under each of" in error for error in choice["formline_errors"])
    stream = client.chat.completions.create(
        model=model, messages=ask("Say it."), max_tokens=8, response_format=schema_format,
        stream=True,
    )  # fmt: skip
    last = [chunk.choices[0] for chunk in stream if chunk.choices][-1]
    assert last.finish_reason == "error" and last.model_extra.get("formline_errors")
