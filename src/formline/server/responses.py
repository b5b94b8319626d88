"""OpenAI's chat completion body (the non-streaming answer); streaming is :mod:`.streaming`."""

from __future__ import annotations

import time
import uuid
from typing import Any

from formline.server.engine import ChoiceOutput, Completion


def new_id() -> str:
    """An id for a completion (``chatcmpl-...``)."""
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


def usage(completion: Completion) -> dict[str, Any]:
    """OpenAI's ``usage`` object (the prompt counted once; completions summed over n), with
    the ``formline_think`` rationales' share of the completion tokens as OpenAI reports a
    reasoning model's."""
    return {
        "prompt_tokens": completion.prompt_tokens,
        "completion_tokens": completion.completion_tokens,
        "total_tokens": completion.prompt_tokens + completion.completion_tokens,
        "completion_tokens_details": {"reasoning_tokens": completion.reasoning_tokens},
    }


def _message(choice: ChoiceOutput) -> dict[str, Any]:
    if choice.reasoning:  # vLLM's and DeepSeek's field for text before the answer
        return {**_answer(choice), "reasoning_content": choice.reasoning}
    return _answer(choice)


def _answer(choice: ChoiceOutput) -> dict[str, Any]:
    if choice.tool_calls is not None:
        # Text the model wrote before its calls (a tagged tool format) is the content.
        content = choice.text or None
        return {"role": "assistant", "content": content, "tool_calls": choice.tool_calls}
    return {"role": "assistant", "content": choice.text}


def completion_body(completion: Completion, model: str) -> dict[str, Any]:
    """The ``chat.completion`` object. An output that failed the after-check has
    ``finish_reason: "error"`` and ``formline_errors`` in its choice (an extra field
    clients ignore; the finish reason they do not)."""
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
