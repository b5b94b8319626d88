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
from typing import Any

from fastapi.concurrency import run_in_threadpool

from formline.constraint import Plan
from formline.pipeline.stream import TextDeltas
from formline.server.engine import ChoiceOutput, Completion, Engine
from formline.server.errors import ApiError, error_body
from formline.server.requests import ChatRequest
from formline.server.responses import new_id, usage
from formline.vocab import Vocabulary

log = logging.getLogger("formline.server")
DONE = "data: [DONE]\n\n"


class ChunkWriter:
    """Server-sent events of one completion: chunks sharing an id, usage, errors."""

    def __init__(self, model: str, include_usage: bool):
        self.base: dict[str, Any] = {"id": new_id(), "object": "chat.completion.chunk"}
        self.base.update({"created": int(time.time()), "model": model})
        self.include_usage = include_usage

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

    def usage(self, completion: Completion) -> str:
        """The usage chunk (``stream_options.include_usage``)."""
        chunk = {**self.base, "choices": [], "usage": usage(completion)}
        return f"data: {json.dumps(chunk)}\n\n"

    @staticmethod
    def error(error: BaseException) -> str:
        """An error event in OpenAI's error shape."""
        if isinstance(error, ApiError):
            body = error.body()
        else:
            body = error_body(f"internal server error: {type(error).__name__}", "server_error")
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


class ChoiceStream:
    """The events of one choice, fed by its decoding loop (see the module's docstring).

    ``emit(event)`` returns ``False`` once the client is gone, which stops the loop."""

    def __init__(
        self,
        index: int,
        plan: Plan,
        vocabulary: Vocabulary,
        writer: ChunkWriter,
        emit: Callable[[str], bool],
    ):
        self.index, self.plan, self.writer, self.emit = index, plan, writer, emit
        # The library's stream listener: text deltas of whole UTF-8 characters.
        self.deltas = TextDeltas(vocabulary, self._text)
        self.route = _route(plan)  # content, arguments, hold, or None (decided by byte 1)
        self.sent = ""  # text sent as content or arguments
        self.held = ""  # text of calls sent whole at the end
        self.call_id = f"call_{uuid.uuid4().hex[:24]}"

    def start(self) -> None:
        self.emit(self.writer.chunk(self.index, {"role": "assistant", "content": ""}))

    @property
    def listener(self) -> TextDeltas:
        """What watches the decoding loop for this choice."""
        return self.deltas

    def _text(self, text: str) -> bool:
        if not text:
            return True
        if self.route is None:
            self.route = "hold" if text[0] in "{[" else "content"
        if self.route == "hold":
            self.held += text
            return True
        return self.emit(self._delta(text))

    def _delta(self, text: str) -> str:
        first = not self.sent
        self.sent += text
        if self.route == "content":
            return self.writer.chunk(self.index, {"content": text})
        call: dict[str, Any] = {"index": 0, "function": {"arguments": text}}
        if first:  # OpenAI's first delta of a call names it; the rest extend its arguments
            call = {"index": 0, "id": self.call_id, "type": "function"}
            call["function"] = {"name": self.plan.tool_name, "arguments": text}
        return self.writer.chunk(self.index, {"tool_calls": [call]})

    def finish(self, choice: ChoiceOutput) -> None:
        self.deltas.flush()
        if self.route in ("content", "arguments") and choice.text.startswith(self.sent):
            self._text(choice.text[len(self.sent) :])  # a backend's own decoding, if longer
        if choice.tool_calls is not None and self.route != "arguments":
            for position, call in enumerate(choice.tool_calls):
                delta = {"tool_calls": [{"index": position, **call}]}
                self.emit(self.writer.chunk(self.index, delta))
        elif self.route == "hold" and choice.text:
            self.emit(self.writer.chunk(self.index, {"content": choice.text}))
        extra = {"formline_errors": choice.errors} if choice.errors else None
        self.emit(self.writer.chunk(self.index, {}, choice.finish_reason, extra))


def _route(plan: Plan) -> str | None:
    if not plan.is_json or plan.mode == "content":
        return "content"
    if plan.mode == "tool_named":
        return "arguments"
    return None if plan.mode == "tool_auto" else "hold"


async def stream_request(engine: Engine, chat: ChatRequest) -> AsyncIterator[str]:
    """The events of ``chat``, decoded on a worker thread as they are sent.

    Raises:
        ApiError: before the first event (bad constraint, model busy): a normal HTTP error.
    Costs a thread-to-loop hop per event (tens of microseconds).
    """
    deadline = engine.deadline()  # the compile, the wait and the decoding share it
    plan = await run_in_threadpool(engine.plan, chat, deadline)
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    gone = threading.Event()
    writer = ChunkWriter(engine.model_id, chat.include_usage)

    def put(kind: str, payload: Any) -> bool:
        if gone.is_set():
            return False
        loop.call_soon_threadsafe(queue.put_nowait, (kind, payload))
        return True

    def listener_for(index: int, choice_plan: Plan) -> ChoiceStream:
        emit: Callable[[str], bool] = lambda event: put("event", event)  # noqa: E731
        return ChoiceStream(index, choice_plan, engine.backend.vocabulary, writer, emit)

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
    writer: ChunkWriter,
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
                yield DONE
                return
            else:
                if writer.include_usage:
                    yield writer.usage(payload)
                yield DONE
                return
            kind, payload = await queue.get()
    finally:
        gone.set()  # a client gone mid-stream stops the loop at its next step
        if not task.done():
            log.info("a streaming client went away; its decoding stops at the next step")
