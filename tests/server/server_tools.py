"""What the server tests share: two function tools, a one-message chat, ``/health``, and
the tool-call deltas of a stream."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

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
