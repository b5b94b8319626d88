"""OpenAI's response bodies: a chat completion, and its server-sent-event chunks.

Streaming here is *generate, then stream*: each choice is decoded in full under its
constraint (the backends' ``generate`` has no per-token callback, and formline does not
change their signatures), then its text is sent as ``chat.completion.chunk`` events of a
few tokens' worth of characters each, a final chunk with ``finish_reason``, an optional
usage chunk, and ``data: [DONE]``. Clients see the OpenAI stream format; the first byte
arrives when the whole completion is ready, not after the first token.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from formline.server.engine import ChoiceOutput, Completion

STREAM_PIECE_CHARS = 16


def new_id() -> str:
    """An id for a completion (``chatcmpl-...``)."""
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


def usage(completion: Completion) -> dict[str, int]:
    """OpenAI's ``usage`` object (the prompt counted once; completions summed over n)."""
    return {
        "prompt_tokens": completion.prompt_tokens,
        "completion_tokens": completion.completion_tokens,
        "total_tokens": completion.prompt_tokens + completion.completion_tokens,
    }


def _message(choice: ChoiceOutput) -> dict[str, Any]:
    if choice.tool_call is not None:
        return {"role": "assistant", "content": None, "tool_calls": [choice.tool_call]}
    return {"role": "assistant", "content": choice.text}


def completion_body(completion: Completion, model: str) -> dict[str, Any]:
    """The ``chat.completion`` object. An output that failed the after-check carries
    ``formline_errors`` in its choice (an extra field clients ignore)."""
    choices = []
    for index, choice in enumerate(completion.choices):
        entry: dict[str, Any] = {
            "index": index,
            "message": _message(choice),
            "finish_reason": choice.finish_reason,
            "logprobs": None,
        }
        if choice.errors:
            entry["formline_errors"] = choice.errors
        choices.append(entry)
    return {
        "id": new_id(),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage(completion),
    }


def stream_events(completion: Completion, model: str, include_usage: bool) -> Iterator[str]:
    """The ``data: ...`` events of a finished completion, ending with ``data: [DONE]``."""
    base = {"id": new_id(), "object": "chat.completion.chunk", "created": int(time.time())}
    base["model"] = model

    def event(index: int, delta: dict[str, Any], finish: str | None = None) -> str:
        chunk = {**base, "choices": [{"index": index, "delta": delta, "finish_reason": finish}]}
        if include_usage:
            chunk["usage"] = None
        return f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"

    for index, choice in enumerate(completion.choices):
        yield event(index, {"role": "assistant", "content": ""})
        if choice.tool_call is not None:
            yield event(index, {"tool_calls": [{"index": 0, **choice.tool_call}]})
        else:
            for start in range(0, len(choice.text), STREAM_PIECE_CHARS):
                yield event(index, {"content": choice.text[start : start + STREAM_PIECE_CHARS]})
        yield event(index, {}, choice.finish_reason)
    if include_usage:
        chunk = {**base, "choices": [], "usage": usage(completion)}
        yield f"data: {json.dumps(chunk)}\n\n"
    yield "data: [DONE]\n\n"
