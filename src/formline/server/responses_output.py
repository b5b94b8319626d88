"""OpenAI's ``Response`` object and the Responses API's streaming events.

One choice becomes one output item: a ``message`` with one ``output_text`` part, or one
``function_call`` item per tool call. The status says how decoding ended:

- ``completed``: the answer is whole and passed the after-check;
- ``incomplete`` (``incomplete_details.reason: "max_output_tokens"``): the budget ran out,
  the items are ``incomplete`` and the text is returned as it stands;
- ``failed`` (``error.code: "invalid_output"``): the answer is whole but failed the
  after-check (the client's schema or the compiled one). The output is still there, and
  ``formline_errors`` lists the findings: never a silent ``completed``.

Streaming (:class:`ResponseEventWriter`) sends ``response.created`` and
``response.in_progress``, then per item ``response.output_item.added``, its deltas
(``response.output_text.delta``, ``response.function_call_arguments.delta``) as they are
decoded, its ``.done`` events, and last ``response.completed`` (or ``.incomplete`` /
``.failed``) with the same object a non-streaming request gets, the same item ids included.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from formline.server.engine import INVALID_FINISH, ChoiceOutput, Completion
from formline.server.errors import ApiError
from formline.server.responses_requests import ResponsesRequest
from formline.server.streaming import error_object


def new_response_id() -> str:
    """An id for a response (``resp_...``)."""
    return f"resp_{uuid.uuid4().hex}"


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def outcome(choice: ChoiceOutput) -> tuple[str, dict[str, Any] | None, dict[str, Any] | None]:
    """The response's ``status``, ``incomplete_details`` and ``error`` for ``choice``."""
    if choice.finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}, None
    if choice.finish_reason == INVALID_FINISH:
        message = "the answer failed formline's after-check: " + "; ".join(choice.errors)
        return "failed", None, {"code": "invalid_output", "message": message}
    return "completed", None, None


def _item_status(choice: ChoiceOutput) -> str:
    return "incomplete" if choice.finish_reason == "length" else "completed"


def message_item(text: str, status: str, item_id: str | None = None) -> dict[str, Any]:
    """An assistant ``message`` item with one ``output_text`` part."""
    return {
        "id": item_id or _item_id("msg"),
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [output_text(text)],
    }


def output_text(text: str) -> dict[str, Any]:
    """An ``output_text`` content part."""
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def function_call_item(
    call_id: str, name: str | None, arguments: str, status: str, item_id: str | None = None
) -> dict[str, Any]:
    """A ``function_call`` item (``call_id`` is what a ``function_call_output`` answers)."""
    return {
        "id": item_id or _item_id("fc"),
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def output_items(choice: ChoiceOutput) -> list[dict[str, Any]]:
    """The output items of one choice (non-streaming)."""
    status = _item_status(choice)
    if choice.tool_calls is None:
        return [message_item(choice.text, status)]
    before = [message_item(choice.text, status)] if choice.text else []  # text, then calls
    return before + [
        function_call_item(
            call["id"], call["function"]["name"], call["function"]["arguments"], status
        )
        for call in choice.tool_calls
    ]


def usage_object(completion: Completion) -> dict[str, Any]:
    """The Responses API's ``usage`` (no cache; no rationale: the Responses API has no
    ``formline_think``)."""
    return {
        "input_tokens": completion.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": completion.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": completion.prompt_tokens + completion.completion_tokens,
    }


def response_object(
    request: ResponsesRequest,
    model: str,
    identity: tuple[str, int],
    output: list[dict[str, Any]],
    completion: Completion | None = None,
) -> dict[str, Any]:
    """The ``response`` object; ``identity`` is its id and ``created_at``. Without a
    ``completion`` it is ``in_progress``; with one, its status is the first choice's."""
    status, incomplete, error = "in_progress", None, None
    errors: list[str] = []
    if completion is not None:
        choice = completion.choices[0]
        status, incomplete, error = outcome(choice)
        errors = choice.errors
    body: dict[str, Any] = {
        "id": identity[0],
        "object": "response",
        "created_at": identity[1],
        "status": status,
        "completed_at": int(time.time()) if completion is not None else None,
        "error": error,
        "incomplete_details": incomplete,
        "model": model,
        "output": output,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": False,  # formline keeps no response (previous_response_id is refused)
        "truncation": "disabled",
        "usage": usage_object(completion) if completion is not None else None,
        **request.echo,
    }
    if errors:
        body["formline_errors"] = errors
    return body


def response_body(request: ResponsesRequest, completion: Completion, model: str) -> dict[str, Any]:
    """The non-streaming answer: the ``response`` object of a finished ``completion``."""
    identity = (new_response_id(), int(time.time()))
    return response_object(
        request, model, identity, output_items(completion.choices[0]), completion
    )


class ResponseEventWriter:
    """The Responses API's server-sent events for one request (one choice: ``n`` is 1).

    Items open on their first delta and close when the choice ends; every event carries a
    ``sequence_number`` (0, 1, ...). Not thread-safe: the choice's decoding thread writes
    all but :meth:`end` and :meth:`error`, which come after it finished."""

    def __init__(self, request: ResponsesRequest, model: str):
        self.request, self.model = request, model
        self.identity = (new_response_id(), int(time.time()))
        self.sequence = 0
        self.items: list[dict[str, Any]] = []  # finished items, in output order
        self.open: dict[str, Any] | None = None  # the item being streamed

    def _event(self, kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def _where(self) -> dict[str, Any]:
        assert self.open is not None
        return {"item_id": self.open["id"], "output_index": len(self.items)}

    def opening(self, index: int) -> str:
        snapshot = response_object(self.request, self.model, self.identity, [])
        created = self._event("response.created", response=snapshot)
        return created + self._event("response.in_progress", response=snapshot)

    def content(self, index: int, text: str) -> str:
        events = ""
        if self.open is None:
            self.open = {**message_item("", "in_progress"), "content": []}
            events += self._event(
                "response.output_item.added", output_index=len(self.items), item=self.open
            )
            events += self._event(
                "response.content_part.added",
                **self._where(),
                content_index=0,
                part=output_text(""),
            )
            self.open["text"] = ""
        self.open["text"] += text
        delta = self._event(
            "response.output_text.delta", **self._where(), content_index=0, delta=text, logprobs=[]
        )
        return events + delta

    def reasoning(self, index: int, text: str) -> str:
        """Nothing: ``formline_think`` is a Chat Completions field (the Responses API's
        ``reasoning`` is refused), so a Responses stream has no rationale to send."""
        return ""

    def arguments(self, index: int, text: str, call_id: str, name: str | None) -> str:
        events = ""
        if self.open is None:
            self.open = function_call_item(call_id, name, "", "in_progress")
            events += self._event(
                "response.output_item.added", output_index=len(self.items), item=dict(self.open)
            )
        self.open["arguments"] += text
        return events + self._event(
            "response.function_call_arguments.delta", **self._where(), delta=text
        )

    def calls(self, index: int, calls: list[dict[str, Any]]) -> str:
        # Text streamed before the calls (a tagged tool format) is a message item of its own.
        events = self._close("completed") if self.open is not None else ""
        for call in calls:
            function = call["function"]
            events += self.arguments(index, function["arguments"], call["id"], function["name"])
            events += self._close("completed")
        return events

    def closing(self, index: int, choice: ChoiceOutput) -> str:
        if self.open is None and not self.items:
            # An empty answer is still one (empty) message, as the non-streaming body has.
            self.open = {**message_item("", "in_progress"), "content": [], "text": ""}
            opened = self._event("response.output_item.added", output_index=0, item=self.open)
            part = output_text("")
            opened += self._event(
                "response.content_part.added", **self._where(), content_index=0, part=part
            )
            return opened + self._close(_item_status(choice))
        return self._close(_item_status(choice)) if self.open is not None else ""

    def _close(self, status: str) -> str:
        assert self.open is not None
        where = self._where()
        if self.open["type"] == "function_call":
            item = {**self.open, "status": status}
            events = self._event(
                "response.function_call_arguments.done", **where, name=item["name"],
                arguments=item["arguments"],
            )  # fmt: skip
        else:
            text = self.open["text"]
            item = message_item(text, status, self.open["id"])
            events = self._event(
                "response.output_text.done", **where, content_index=0, text=text, logprobs=[]
            )
            events += self._event(
                "response.content_part.done", **where, content_index=0, part=output_text(text)
            )
        events += self._event(
            "response.output_item.done", output_index=where["output_index"], item=item
        )
        self.items.append(item)
        self.open = None
        return events

    def end(self, completion: Completion) -> str:
        """``response.completed`` (``.incomplete``, ``.failed``) with the whole response."""
        body = response_object(self.request, self.model, self.identity, self.items, completion)
        return self._event(f"response.{body['status']}", response=body)

    def error(self, error: BaseException) -> str:
        """An ``error`` event: OpenAI's error fields, flat."""
        fields = error_object(error)["error"]
        code = fields["code"] if isinstance(error, ApiError) else "server_error"
        return self._event("error", code=code, message=fields["message"], param=fields["param"])
