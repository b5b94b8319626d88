"""``formline.stream``: the value while it is decoded, then the validated value.

``for partial in formline.stream(prompt, Person): ...`` (or ``async for``) yields a partial
value each time the output grows into a new one: for a Pydantic model an instance of its
partial twin (:func:`~formline.pipeline.partial.partial_model`, instructor's ``Partial``:
fields fill in as they are decoded, the string being written included), for a JSON Schema
the parsed partial JSON, for text the text so far. The last item is the final value, typed
and checked as ``formline.generate(...).value`` gives it, or the same typed errors
(:class:`~formline.pipeline.generate.TruncatedOutput`,
:class:`~formline.pipeline.generate.InvalidOutput`) at the end of the iteration.

The loop runs on a worker thread (the one decoding loop, with a :class:`TextDeltas`
listener); leaving the iteration early stops it at its next step. The server's streamed
chunks use the same listener. An engine decodes one sequence at a time: another stream or
``generate`` on the same engine, even inside the loop, waits for this one's decoding.
"""

from __future__ import annotations

import asyncio
import codecs
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from formline.backends.base import Backend
from formline.pipeline.decoding import Sampling
from formline.pipeline.generate import (
    DEFAULT_DESCRIBE,
    DEFAULT_NUMBERS,
    DEFAULT_WHITESPACE,
    GenerationRequest,
    Result,
    Shaping,
    backend_for,
)
from formline.pipeline.listeners import StepListener
from formline.pipeline.partial import NOTHING, PartialJson, partial_model
from formline.vocab import Vocabulary


class TextDeltas(StepListener):
    """Turns the output's tokens into text as it grows, whole UTF-8 characters only (a
    character split across tokens waits for its last byte), special tokens left out;
    ``callback(delta)`` returning ``False`` stops the loop (``"cancelled"``). Costs one
    incremental decode per step."""

    def __init__(self, vocabulary: Vocabulary, callback: Callable[[str], bool | None]):
        self.token_bytes, self.special = vocabulary.token_bytes, vocabulary.special_ids
        self.callback = callback
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.seen = 0

    def on_output(self, output: list[int]) -> str | None:
        fresh, self.seen = output[self.seen :], len(output)
        data = b"".join(self.token_bytes[t] for t in fresh if t not in self.special)
        return self.send(self.decoder.decode(data))

    def send(self, text: str) -> str | None:
        """Hand ``text`` to the callback (nothing for ``""``); ``"cancelled"`` if it says stop."""
        if text and self.callback(text) is False:
            return "cancelled"
        return None

    def flush(self) -> str | None:
        """Send what the decoder still holds (an incomplete character, replaced)."""
        return self.send(self.decoder.decode(b"", final=True))


def stream(
    prompt: str | list[dict[str, str]],
    output: Any = None,
    model: Backend | str | Path | None = None,
    *,
    backend: str = "llama_cpp",
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
    max_tokens: int = 256,
    describe_schema: bool | str = DEFAULT_DESCRIBE,
    jump_forward: bool = True,
    system: str | None = None,
    whitespace: int | None = DEFAULT_WHITESPACE,
    numbers: str = DEFAULT_NUMBERS,
) -> Stream:
    """A :class:`Stream` of ``prompt`` under ``output``: :func:`formline.generate`'s
    arguments, iterated (sync or async) for partial values and the final one (``think``
    is not offered: the partial values are read from the answer as it is written).

    Raises (here, before any decoding):
        formline.schema.SchemaError / GrammarError: ``output`` does not compile.
        BackendError: the model cannot be loaded.
    Costs one compile (cached); iterating costs the decoding loop plus a partial parse per
    step (one ``json.loads`` of the text so far, and a partial model's validation).
    """
    request = GenerationRequest.prepare(
        prompt,
        output,
        backend_for(model, backend),
        Sampling(temperature, top_p, seed, max_tokens, jump_forward),
        describe_schema=describe_schema,
        system=system,
        shaping=Shaping(whitespace, numbers),
    )
    return Stream(request)


class Stream:
    """Partial values of one generation as it is decoded (see the module's doc); after the
    iteration, :attr:`result` is the :class:`~formline.pipeline.generate.Result`."""

    def __init__(self, request: GenerationRequest):
        self.request = request
        self.result: Result | None = None
        self.text = ""
        self._cancelled = threading.Event()
        self._started = False

    def __iter__(self) -> Iterator[Any]:
        events: queue.Queue[tuple[str, Any]] = queue.Queue()
        # The reader first: its partial model may fail to build, and after _start that
        # failure left the worker decoding, holding the engine's turn, with no one to stop it.
        reader = _PartialReader(self.request)
        worker = self._start(events.put)
        try:
            while True:
                kind, payload = events.get()
                if kind == "text":
                    yield from reader.read(payload)
                else:
                    yield self._end(kind, payload)
                    return
        finally:
            self._cancelled.set()  # a consumer that left early stops the loop
            worker.join()

    async def __aiter__(self) -> AsyncIterator[Any]:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        reader = _PartialReader(self.request)  # before the worker starts: see __iter__
        worker = self._start(lambda item: loop.call_soon_threadsafe(events.put_nowait, item))
        try:
            while True:
                kind, payload = await events.get()
                if kind == "text":
                    for partial in reader.read(payload):
                        yield partial
                else:
                    yield self._end(kind, payload)
                    return
        finally:
            self._cancelled.set()
            await asyncio.to_thread(worker.join)

    def _start(self, put: Callable[[tuple[str, Any]], object]) -> threading.Thread:
        if self._started:
            raise RuntimeError("a Stream is iterated once; call formline.stream again")
        self._started = True

        def send(text: str) -> bool:
            self.text += text
            put(("text", text))
            return not self._cancelled.is_set()

        def produce() -> None:
            deltas = TextDeltas(self.request.engine.vocabulary, send)
            try:
                result = self.request.run([deltas])
                deltas.flush()
            except BaseException as error:  # every failure reaches the consumer
                put(("error", error))
            else:
                put(("end", result))

        worker = threading.Thread(target=produce, name="formline-stream", daemon=True)
        worker.start()
        return worker

    def _end(self, kind: str, payload: Any) -> Any:
        if kind == "error":
            raise payload
        self.result = payload
        return payload.value  # raises TruncatedOutput / InvalidOutput like generate's


class _PartialReader:
    """The partial values of a growing text, each yielded once it differs from the last.

    Raises (when built):
        pydantic.PydanticUndefinedAnnotation: the output model's partial twin cannot be
            built (see :func:`~formline.pipeline.partial.partial_model`).
    """

    def __init__(self, request: GenerationRequest):
        self.kind = request.plan.kind
        # The model as the caller gave it: with numbers="tolerant" the compiled constraint
        # is the rewritten schema, which has no model, and the partials were plain dicts.
        model = request.given.output_model or request.plan.constraint.output_model
        self.partial_type = partial_model(model) if model is not None else None
        self.json = PartialJson()
        self.text = ""
        self.last: Any = NOTHING

    def read(self, delta: str) -> Iterator[Any]:
        self.text += delta
        if self.kind == "text":
            value = self.text
        else:
            self.json.feed(delta)
            value = self._typed()
        if value is not NOTHING and value != self.last:
            self.last = value
            yield value

    def _typed(self) -> Any:
        value = self.json.value()
        if self.partial_type is None or value is NOTHING:
            return value
        # A value the twin refuses (the string being written breaks a type, or a tolerant
        # number still spelled out) is left out, not the whole object: each pass drops the
        # value one error points at, so the loop ends within the value's size.
        for _ in range(MAX_DROPPED):
            try:
                return self.partial_type.model_validate(value)
            except ValidationError as error:
                value = _without(value, error.errors()[0]["loc"])
                if value is NOTHING:
                    return NOTHING
        return NOTHING


MAX_DROPPED = 64  # values left out of one partial before it is given up for this step


def _without(value: Any, location: tuple[int | str, ...]) -> Any:
    """A copy of ``value`` without what ``location`` (a validation error's) points at: the
    deepest object member it names is removed, or a list cut before the item it names
    (later items of a partial list are newer); ``NOTHING`` when it names no member (the
    value as a whole is refused). The location's other parts, such as a union member's
    name, end the walk: what was reached is removed whole."""
    path: list[int | str] = []
    node = value
    for part in location:
        if not _holds(node, part):
            break
        node = node[part]
        path.append(part)
    if not path:
        return NOTHING
    return _removed(value, path)


def _holds(node: Any, part: int | str) -> bool:
    """Whether ``part`` names a member of ``node`` (an object's key, a list's index)."""
    if isinstance(node, dict):
        return isinstance(part, str) and part in node
    return isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)


def _removed(value: Any, path: list[int | str]) -> Any:
    head, *rest = path
    if rest:
        copied = dict(value) if isinstance(value, dict) else list(value)
        copied[head] = _removed(value[head], rest)  # type: ignore[index]
        return copied
    if isinstance(value, dict):
        return {key: item for key, item in value.items() if key != head}
    return value[: int(head)]
