"""``POST /trace``: seed 003's explainer page, recorded on the served model within the
request's time limit.

The body is ``{"prompt", "schema"}`` with ``free_samples``, ``temperature`` and
``max_tokens`` optional; any other field, a wrong type or an out-of-range value is a 400
naming it. The schema is compiled before the model is taken (a compile never holds the
model); the wait for the model ends at the request's deadline (``limits.request_seconds``,
503), and so does the recording: every decoding loop of the recorder stops at its first
step past the deadline, and the request answers 504 with the model freed at once. A client
that goes away stops the recording the same way, at its next step (it held the model for
133 s after its client had gone, every other request waiting).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any

from formline.backends.base import Backend, BackendError
from formline.constraint import compile_error_message
from formline.schema import SchemaError, compile_schema
from formline.server.engine import Engine
from formline.server.errors import ApiError, unsupported
from formline.server.requests import Limits
from formline.trace.html import render_trace_html
from formline.trace.recorder import record_trace

# name: (lowest, highest, default, type) of each option
OPTIONS: dict[str, tuple[float, float, float, type]] = {
    "free_samples": (0, 8, 2, int),
    "max_tokens": (1, 256, 64, int),
    "temperature": (0.0, 2.0, 0.8, float),
}
FIELDS = frozenset({"prompt", "schema", *OPTIONS})


class PastDeadlineError(Exception):
    """The recording reached a step past the request's deadline."""


class ClientGoneError(Exception):
    """The recording reached a step after its client had gone."""


@dataclass(frozen=True)
class TraceRequest:
    """A checked ``/trace`` body."""

    prompt: str
    schema: dict[str, Any]
    options: dict[str, Any]


def parse_trace_request(body: dict[str, Any], limits: Limits) -> TraceRequest:
    """Check a ``/trace`` body (already without ``null`` values).

    Raises:
        ApiError: 400 for a missing, unknown, mistyped or out-of-range field (named), or a
            schema over ``limits.max_schema_bytes``.
    Costs O(size of the body).
    """
    for key in body:
        if key not in FIELDS:
            raise unsupported(key, f"/trace takes {sorted(FIELDS)}")
    prompt, schema = body.get("prompt"), body.get("schema")
    if not isinstance(prompt, str):
        raise ApiError("/trace needs 'prompt' (a string)", param="prompt", code="invalid_type")
    if not isinstance(schema, dict):
        raise ApiError("/trace needs 'schema' (an object)", param="schema", code="invalid_type")
    size = len(json.dumps(schema))
    if size > limits.max_schema_bytes:
        raise ApiError(
            f"schema has {size} bytes; the limit is {limits.max_schema_bytes}",
            param="schema", code="schema_too_large",
        )  # fmt: skip
    options = {}
    for key, (low, high, default, kind) in OPTIONS.items():
        value = body.get(key, default)
        integral = isinstance(value, int) or kind is float
        if isinstance(value, bool) or not isinstance(value, int | float) or not integral:
            raise ApiError(f"{key} must be a {kind.__name__}", param=key, code="invalid_type")
        if not low <= value <= high:
            raise ApiError(f"{key} must be from {low} to {high}", param=key, code="invalid_value")
        options[key] = kind(value)
    return TraceRequest(prompt, schema, options)


def trace_page(engine: Engine, request: TraceRequest, gone: threading.Event | None = None) -> str:
    """The explainer page of ``request``, recorded under the engine's lock by the request's
    deadline (:meth:`Engine.deadline`), stopped at its next step once ``gone`` is set (the
    client went away: counted as a ``"cancelled"`` loop).

    Raises:
        ApiError: 400 for a schema that does not compile, a prompt over the context or a
            backend other than llama.cpp; 503 when the model stays busy past the deadline;
            504 when the compile or the recording runs past it; 499 once ``gone`` stops it.
    Costs one compile (cached) plus the recorder's ``3 x free_samples + 1`` generations.
    """
    deadline = engine.deadline()
    if not hasattr(engine.backend, "llm"):
        raise ApiError("/trace records on the llama.cpp backend only", param="model")
    with engine.counting_compile():  # the recorder's own compile is then a cache lookup
        try:
            compile_schema(request.schema, engine.backend.vocabulary)
        except SchemaError as error:  # a compile limit is coded as one, as on /v1
            message, code = compile_error_message(error, "schema")
            raise ApiError(message, param="schema", code=code) from error
    if time.monotonic() > deadline:
        raise _past_deadline(engine, "compiling the schema")
    engine.hold_model(deadline)
    try:
        backend = DeadlineBackend(engine.backend, deadline, gone or threading.Event())
        trace = record_trace(
            request.schema, request.prompt, backend, field_orders=False, **request.options
        )
    except PastDeadlineError as error:
        raise _past_deadline(engine, "recording the trace") from error
    except ClientGoneError as error:  # nobody reads this answer; the log and /health do
        engine.count_cancelled()
        raise ApiError("the client went away", status=499, code="cancelled") from error
    except BackendError as error:
        if "n_ctx" in str(error):
            raise ApiError(str(error), param="prompt", code="context_length_exceeded") from error
        raise
    finally:
        engine.lock.release()
    return render_trace_html(trace)


def _past_deadline(engine: Engine, what: str) -> ApiError:
    return ApiError(
        f"{what} ran past this server's {engine.limits.request_seconds} s per request; lower "
        "max_tokens or free_samples, or start the server with a larger --request-seconds",
        status=504,
        code="timeout",
        error_type="timeout",
    )


class DeadlineBackend:
    """``backend`` as the recorder sees it, stopping at ``deadline`` or once ``gone`` is
    set: every forward pass then raises :class:`PastDeadlineError` or
    :class:`ClientGoneError`, so each of the recorder's decoding loops stops at its next
    step. Everything else is ``backend``'s."""

    def __init__(self, backend: Backend, deadline: float, gone: threading.Event):
        self.backend = backend
        self.deadline = deadline
        self.gone = gone

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def forward(self, token_ids: list[int]) -> Any:
        """The backend's forward pass. Raises :class:`PastDeadlineError` past the deadline,
        :class:`ClientGoneError` once ``gone`` is set."""
        if self.gone.is_set():
            raise ClientGoneError
        if time.monotonic() > self.deadline:
            raise PastDeadlineError
        return self.backend.forward(token_ids)
