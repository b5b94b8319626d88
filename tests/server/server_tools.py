"""What the server tests share: two function tools, a one-message chat, ``/health``, the
tool-call deltas of a stream, an engine with other limits on the same model, a raw POST."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import replace
from typing import Any

from formline.server.engine import Engine

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 30},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a timezone.",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string", "maxLength": 30}},
            "required": ["timezone"],
            "additionalProperties": False,
        },
    },
}


def ask(text: str) -> list[dict[str, str]]:
    """A chat of one user message."""
    return [{"role": "user", "content": text}]


def health(url: str) -> dict[str, Any]:
    """The server's ``/health`` body."""
    with urllib.request.urlopen(f"{url}/health", timeout=10) as reply:
        body: dict[str, Any] = json.load(reply)
        return body


def tool_call_deltas(stream: Any) -> tuple[list[Any], list[str | None]]:
    """A streamed answer's ``tool_calls`` deltas and its choices' finish reasons, in order."""
    deltas: list[Any] = []
    finishes: list[str | None] = []
    for chunk in stream:
        for choice in chunk.choices:
            deltas.extend(choice.delta.tool_calls or [])
            finishes.append(choice.finish_reason)
    return deltas, finishes


def engine_with(engine: Engine, **limits: Any) -> Engine:
    """An engine over ``engine``'s model *and lock* with other limits: llama.cpp is not
    thread-safe, so every engine on one model must share its lock."""
    other = Engine(engine.backend, engine.model_id, replace(engine.limits, **limits))
    other.lock = engine.lock
    return other


def post_json(
    url: str, body: Any, headers: dict[str, str] | None = None, timeout: float = 120
) -> tuple[int, Any]:
    """A raw POST of ``body`` (JSON, or bytes as they are): the status and the reply, parsed
    as JSON when it is JSON."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST")
    request.add_header("Content-Type", "application/json")
    for key, value in (headers or {}).items():
        request.add_header(key, value)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            status, raw = reply.status, reply.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")
