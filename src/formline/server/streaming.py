"""Streaming per token: OpenAI's ``chat.completion.chunk`` events as the model decodes.

:class:`ChoiceStream` listens to one choice's decoding loop (see
:class:`~formline.server.engine.ChoiceListener`) and turns each step's tokens into events:

- text and JSON answers (``content``) and a named tool's arguments are sent as they are
  decoded (a multi-byte character split across tokens waits for its last byte);
- ``tool_choice`` ``required`` (and ``auto`` once the first byte is ``{`` or ``[``) wraps the
  calls in ``{"name", "arguments"}`` objects, so their calls are sent whole at the end, one
  ``tool_calls`` delta each, with the ids the non-streaming body would carry;
- the last event of a choice carries its ``finish_reason``; when the after-check failed
  (the client's schema or the compiled one), that is ``"error"`` and the event also carries
  ``formline_errors``: a streamed answer cannot be taken back, so it is flagged at its end.

:func:`stream_request` runs the request on a worker thread and hands the events to an async
response through an ``asyncio.Queue``. An error before the first event is raised (the client
gets a normal HTTP error); one after it is an ``{"error": ...}`` event, which the ``openai``
client raises as ``APIError``. A client that goes away stops the decoding loop at its next
step, which frees the model for the next request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from fastapi.concurrency import run_in_threadpool

from formline.constraint import Plan
from formline.mask.tagged import trigger_of
from formline.pipeline.stream import TextDeltas
from formline.server.engine import ChoiceOutput, Completion, Engine
from formline.server.errors import ApiError, error_body
from formline.server.requests import ChatRequest
from formline.server.responses import new_id, usage
from formline.server.tool_formats import FORMATS
from formline.vocab import Vocabulary

log = logging.getLogger("formline.server")
DONE = "data: [DONE]\n\n"


class EventWriter(Protocol):
    """Writes one API's server-sent events (Chat Completions chunks, Responses events);
    each method returns the text of zero or more events, written in order."""

    def opening(self, index: int) -> str: ...

    def content(self, index: int, text: str) -> str: ...

    def reasoning(self, index: int, text: str) -> str: ...

    def arguments(self, index: int, text: str, call_id: str, name: str | None) -> str: ...

    def calls(self, index: int, calls: list[dict[str, Any]]) -> str: ...

    def closing(self, index: int, choice: ChoiceOutput) -> str: ...

    def end(self, completion: Completion) -> str: ...

    def error(self, error: BaseException) -> str: ...


class ChunkWriter:
    """Chat Completions' events: ``chat.completion.chunk`` objects sharing an id, the usage
    chunk, errors, then ``[DONE]``."""

    def __init__(self, model: str, include_usage: bool):
        self.base: dict[str, Any] = {"id": new_id(), "object": "chat.completion.chunk"}
        self.base.update({"created": int(time.time()), "model": model})
        self.include_usage = include_usage
        self.calling: set[int] = set()  # choices whose call has had its first delta

    def chunk(
        self,
        index: int,
        delta: dict[str, Any],
        finish: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> str:
        """One ``chat.completion.chunk`` event for choice ``index``."""
        choice = {"index": index, "delta": delta, "finish_reason": finish, **(extra or {})}
        chunk: dict[str, Any] = {**self.base, "choices": [choice]}
        if self.include_usage:
            chunk["usage"] = None
        return f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"

    def opening(self, index: int) -> str:
        return self.chunk(index, {"role": "assistant", "content": ""})

    def content(self, index: int, text: str) -> str:
        return self.chunk(index, {"content": text})

    def reasoning(self, index: int, text: str) -> str:
        """A delta of the rationale before a JSON answer (``formline_think``)."""
        return self.chunk(index, {"reasoning_content": text})

    def arguments(self, index: int, text: str, call_id: str, name: str | None) -> str:
        call: dict[str, Any] = {"index": 0, "function": {"arguments": text}}
        if index not in self.calling:  # OpenAI's first delta of a call names it
            self.calling.add(index)
            call = {"index": 0, "id": call_id, "type": "function"}
            call["function"] = {"name": name, "arguments": text}
        return self.chunk(index, {"tool_calls": [call]})

    def calls(self, index: int, calls: list[dict[str, Any]]) -> str:
        return "".join(
            self.chunk(index, {"tool_calls": [{"index": position, **call}]})
            for position, call in enumerate(calls)
        )

    def closing(self, index: int, choice: ChoiceOutput) -> str:
        extra = {"formline_errors": choice.errors} if choice.errors else None
        return self.chunk(index, {}, choice.finish_reason, extra)

    def end(self, completion: Completion) -> str:
        """The usage chunk (``stream_options.include_usage``), then ``[DONE]``."""
        if not self.include_usage:
            return DONE
        chunk = {**self.base, "choices": [], "usage": usage(completion)}
        return f"data: {json.dumps(chunk)}\n\n{DONE}"

    def error(self, error: BaseException) -> str:
        """An error event in OpenAI's error shape, then ``[DONE]``."""
        return f"data: {json.dumps(error_object(error), ensure_ascii=False)}\n\n{DONE}"


def error_object(error: BaseException) -> dict[str, Any]:
    """OpenAI's error body for ``error``: its own for an :class:`ApiError`, else a server
    fault that names only the exception's type."""
    if isinstance(error, ApiError):
        return error.body()
    return error_body(f"internal server error: {type(error).__name__}", "server_error")


class ChoiceStream:
    """The events of one choice, fed by its decoding loop (see the module's docstring).

    ``emit(event)`` returns ``False`` once the client is gone, which stops the loop."""

    def __init__(
        self,
        index: int,
        plan: Plan,
        vocabulary: Vocabulary,
        writer: EventWriter,
        emit: Callable[[str], bool],
        think_trigger: str | None = None,
    ):
        self.index, self.plan, self.writer, self.emit = index, plan, writer, emit
        # With formline_think, text before the answer's first byte is the rationale.
        self.thinking = think_trigger
        # The library's stream listener: text deltas of whole UTF-8 characters.
        self.deltas = TextDeltas(vocabulary, self._text)
        self.route = _route(plan)  # content, arguments, hold, or None (decided by byte 1)
        self.sent = ""  # text sent as content or arguments
        self.held = ""  # text of calls sent whole at the end
        self.call_id = f"call_{uuid.uuid4().hex[:24]}"
        # A tagged tool format streams text as content but holds back what may start its
        # trigger (``<tool_c`` ...) until the trigger is complete (then a call) or broken.
        form = FORMATS[plan.tool_format] if plan.mode == "tool_tagged" else None
        self.trigger = form.trigger.decode() if form is not None and form.trigger else None
        self.pending = ""

    def start(self) -> None:
        self.emit(self.writer.opening(self.index))

    @property
    def listener(self) -> TextDeltas:
        """What watches the decoding loop for this choice."""
        return self.deltas

    def _text(self, text: str) -> bool:
        if self.thinking is not None and text:
            at = text.find(self.thinking)
            before, text = (text, "") if at < 0 else (text[:at], text[at:])
            if at >= 0:
                self.thinking = None
            if before and not self.emit(self.writer.reasoning(self.index, before)):
                return False
        if not text:
            return True
        if self.trigger is not None and self.route == "content":
            return self._tagged_text(text)
        if self.route is None:
            self.route = "hold" if text[0] in "{[" else "content"
        if self.route == "hold":
            self.held += text
            return True
        self.sent += text
        if self.route == "content":
            return self.emit(self.writer.content(self.index, text))
        return self.emit(self.writer.arguments(self.index, text, self.call_id, self.plan.tool_name))

    def _tagged_text(self, text: str) -> bool:
        assert self.trigger is not None
        self.pending += text
        at = self.pending.find(self.trigger)
        if at >= 0:
            send, self.held, self.pending = self.pending[:at], self.pending[at:], ""
            self.route = "hold"
        else:
            keep = _partial_suffix(self.pending, self.trigger)
            cut = len(self.pending) - keep
            send, self.pending = self.pending[:cut], self.pending[cut:]
        if not send:
            return True
        self.sent += send
        return self.emit(self.writer.content(self.index, send))

    def finish(self, choice: ChoiceOutput) -> None:
        self.deltas.flush()
        if self.pending:  # a partial trigger at the end was text after all
            self.sent += self.pending
            self.emit(self.writer.content(self.index, self.pending))
            self.pending = ""
        if self.route in ("content", "arguments") and choice.text.startswith(self.sent):
            self._text(choice.text[len(self.sent) :])  # a backend's own decoding, if longer
        if choice.tool_calls is not None and self.route != "arguments":
            self.emit(self.writer.calls(self.index, choice.tool_calls))
        elif self.route == "hold" and choice.text:
            rest = choice.text  # a cut-off call is text; what went out as text is not resent
            if self.sent and rest.startswith(self.sent):
                rest = rest[len(self.sent) :]
            self.emit(self.writer.content(self.index, rest))
        self.emit(self.writer.closing(self.index, choice))


def _partial_suffix(text: str, trigger: str) -> int:
    """The length of the longest end of ``text`` that begins ``trigger``."""
    for length in range(min(len(text), len(trigger) - 1), 0, -1):
        if trigger.startswith(text[-length:]):
            return length
    return 0


def _route(plan: Plan) -> str | None:
    if not plan.is_json or plan.mode in ("content", "tool_tagged"):
        return "content"
    if plan.mode == "tool_named":
        return "arguments"
    return None if plan.mode == "tool_auto" else "hold"


async def stream_request(
    engine: Engine, chat: ChatRequest, writer: EventWriter
) -> AsyncIterator[str]:
    """The events of ``chat`` as ``writer`` writes them, decoded on a worker thread as
    they are sent.

    Raises:
        ApiError: before the first event (bad constraint, model busy): a normal HTTP error.
    Costs a thread-to-loop hop per event (tens of microseconds).
    """
    deadline = engine.deadline()  # the compile, the wait and the decoding share it
    plan = await run_in_threadpool(engine.plan, chat, deadline)
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    gone = threading.Event()

    def put(kind: str, payload: Any) -> bool:
        if gone.is_set():
            return False
        loop.call_soon_threadsafe(queue.put_nowait, (kind, payload))
        return True

    trigger = None
    if chat.think and plan.compiled is not None:  # plan_output checked it has one
        trigger = trigger_of(plan.compiled).decode("utf-8", errors="replace")

    def listener_for(index: int, choice_plan: Plan) -> ChoiceStream:
        emit: Callable[[str], bool] = lambda event: put("event", event)  # noqa: E731
        vocabulary = engine.backend.vocabulary
        return ChoiceStream(index, choice_plan, vocabulary, writer, emit, trigger)

    async def work() -> None:
        try:
            completion = await run_in_threadpool(
                engine.complete, chat, plan, listener_for, deadline
            )
        except Exception as error:  # every failure reaches the client, as an event if late
            put("error", error)
        else:
            put("end", completion)

    task = asyncio.create_task(work())
    kind, payload = await queue.get()
    if kind == "error":
        raise payload
    return _events(kind, payload, queue, writer, gone, task)


async def _events(
    kind: str,
    payload: Any,
    queue: asyncio.Queue[tuple[str, Any]],
    writer: EventWriter,
    gone: threading.Event,
    task: asyncio.Task[None],
) -> AsyncIterator[str]:
    try:
        while True:
            if kind == "event":
                if payload:
                    yield payload
            elif kind == "error":
                if not isinstance(payload, ApiError):
                    log.error("server fault while streaming", exc_info=payload)
                yield writer.error(payload)
                return
            else:
                yield writer.end(payload)
                return
            kind, payload = await queue.get()
    finally:
        gone.set()  # a client gone mid-stream stops the loop at its next step
        if not task.done():
            log.info("a streaming client went away; its decoding stops at the next step")
