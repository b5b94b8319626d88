"""The FastAPI app of ``formline serve``: OpenAI-compatible Chat Completions and Responses.

Routes: ``GET /health`` (and ``HEAD``), ``GET /v1/models`` and ``/v1/models/{model}``,
``POST /v1/chat/completions``, ``POST /v1/responses`` (:mod:`.responses_requests`,
:mod:`.responses_output`), ``POST /trace`` (:mod:`.tracing`). Every error is OpenAI's error
object: 4xx for bad input (:class:`ApiError`, and unknown routes), 500 only for a real fault,
which is logged with its traceback. With ``api_key`` set, every route but ``GET /health``
needs ``Authorization: Bearer <api_key>`` (unknown routes too, so they say nothing without
it); ``/health`` stays open for load balancers and tells only the model id, whether the
model is held (``busy``), how many constraint compiles are running (``compiling``) and the
decoding loops' counts. Every route that uses the model answers within
``limits.request_seconds`` (503 or 504 past it).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from formline.pipeline.listeners import StepListener
from formline.server.engine import ChoiceOutput, Completion, Engine
from formline.server.errors import ApiError, error_body
from formline.server.requests import (
    ChatRequest,
    Limits,
    parse_body,
    parse_chat_request,
    request_too_large,
)
from formline.server.responses import completion_body
from formline.server.responses_output import ResponseEventWriter, response_body
from formline.server.responses_requests import parse_responses_request
from formline.server.streaming import ChunkWriter, stream_request
from formline.server.tracing import parse_trace_request, trace_page

T = TypeVar("T")

log = logging.getLogger("formline.server")


def create_app(engine: Engine, api_key: str | None = None) -> FastAPI:
    """The app serving ``engine``. Costs nothing until requests arrive."""
    app = FastAPI(title="formline", docs_url=None, redoc_url=None, openapi_url=None)
    started = int(time.time())
    _install_error_handlers(app)
    if api_key:
        _install_api_key(app, api_key)

    @app.api_route("/health", methods=["GET", "HEAD"])  # HEAD: load balancers
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "model": engine.model_id,
            "busy": engine.lock.locked(),  # a decoding loop or a trace holds the model
            "compiling": engine.compiling,
            "loops": engine.stats,
        }

    def model_entry() -> dict[str, Any]:
        """The served model as OpenAI's ``model`` object."""
        entry = {"id": engine.model_id, "object": "model", "created": started}
        return {**entry, "owned_by": "formline"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_entry()]}

    # ``:path``: an id may hold slashes (``org/name``); it was a plain 404 without the route.
    @app.get("/v1/models/{model:path}")
    async def one_model(model: str) -> dict[str, Any]:
        _check_model(model, engine)
        return model_entry()

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request) -> JSONResponse | StreamingResponse:
        body = parse_body(await read_body(request, engine.limits), engine.limits)
        chat = parse_chat_request(body, engine.limits)
        _check_model(chat.model, engine)
        if chat.stream:
            writer = ChunkWriter(engine.model_id, chat.include_usage)
            events = await stream_request(engine, chat, writer)
            return StreamingResponse(events, media_type="text/event-stream")
        # The deadline starts here: a wait for a worker thread counts (it did not).
        completion = await complete_while_connected(engine, request, chat, engine.deadline())
        return JSONResponse(completion_body(completion, engine.model_id))

    @app.post("/v1/responses", response_model=None)
    async def responses(request: Request) -> JSONResponse | StreamingResponse:
        body = parse_body(await read_body(request, engine.limits), engine.limits)
        checked = parse_responses_request(body, engine.limits)
        _check_model(checked.chat.model, engine)
        if checked.chat.stream:
            writer = ResponseEventWriter(checked, engine.model_id)
            events = await stream_request(engine, checked.chat, writer)
            return StreamingResponse(events, media_type="text/event-stream")
        deadline = engine.deadline()  # from the request's arrival, as for chat completions
        completion = await complete_while_connected(engine, request, checked.chat, deadline)
        return JSONResponse(response_body(checked, completion, engine.model_id))

    @app.post("/trace", response_model=None)
    async def trace(request: Request) -> HTMLResponse:
        """Seed 003's explainer for ``{"prompt", "schema"}`` (``free_samples``,
        ``temperature``, ``max_tokens`` optional), recorded now on the served model."""
        body = parse_body(await read_body(request, engine.limits), engine.limits)
        checked = parse_trace_request(body, engine.limits)
        page = await run_while_connected(request, lambda gone: trace_page(engine, checked, gone))
        return HTMLResponse(page)

    return app


async def read_body(request: Request, limits: Limits) -> bytes:
    """The body, read no further than ``limits.max_request_bytes``: a declared
    ``Content-Length`` over it is refused before anything is read, and a body that runs
    past it is cut off there (a 300 MB body was read whole, 900 MB of the server's
    memory, before its 413).

    Raises:
        ApiError: 413 naming the limit.
    Costs the body's bytes up to the limit."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limits.max_request_bytes:
        raise request_too_large(f"{int(declared)} bytes", limits)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limits.max_request_bytes:
            raise request_too_large(f"more than {limits.max_request_bytes} bytes", limits)
        chunks.append(chunk)
    return b"".join(chunks)


async def complete_while_connected(
    engine: Engine, request: Request, chat: ChatRequest, deadline: float
) -> Completion:
    """``engine.complete(chat)`` by ``deadline`` (from the request's arrival: a wait for a
    worker thread counts), stopped at its next step once the client has gone: a dropped
    non-streaming client kept the model decoding to ``max_tokens`` while the next request
    waited (a stream stops through its own events). Costs a disconnect check every
    :data:`DISCONNECT_CHECK_SECONDS` while it runs."""

    def complete(gone: threading.Event) -> Completion:
        return engine.complete(chat, None, lambda *_: _WhileConnected(gone), deadline)

    return await run_while_connected(request, complete)


async def run_while_connected(request: Request, work_of: Callable[[threading.Event], T]) -> T:
    """``work_of(gone)`` in a worker thread, ``gone`` set once the client has gone (or the
    handler is cancelled): the work stops itself at its next step when it sees it. Costs a
    disconnect check every :data:`DISCONNECT_CHECK_SECONDS` while it runs."""
    gone = threading.Event()
    work = asyncio.ensure_future(run_in_threadpool(work_of, gone))
    try:
        while not work.done():
            await asyncio.wait({work}, timeout=DISCONNECT_CHECK_SECONDS)
            if not work.done() and await request.is_disconnected():
                gone.set()
        return work.result()
    finally:
        gone.set()  # a handler cancelled (a shutdown) stops the loop too


DISCONNECT_CHECK_SECONDS = 0.25


class _StopsWhenGone(StepListener):
    """Stops the loop (``"cancelled"``) at the first step after ``gone`` is set."""

    def __init__(self, gone: threading.Event):
        self.gone = gone

    def on_output(self, output: list[int]) -> str | None:
        return "cancelled" if self.gone.is_set() else None


class _WhileConnected:
    """The :class:`~formline.server.engine.ChoiceListener` of a non-streaming choice: it
    only stops the loop when the client has gone."""

    def __init__(self, gone: threading.Event):
        self.listener: StepListener = _StopsWhenGone(gone)

    def start(self) -> None:
        return None

    def finish(self, choice: ChoiceOutput) -> None:
        return None


def _check_model(model: str, engine: Engine) -> None:
    if model != engine.model_id:
        raise ApiError(
            f"the model {model!r} does not exist; this server serves {engine.model_id!r}",
            status=404,
            param="model",
            code="model_not_found",
        )


def _install_error_handlers(app: FastAPI) -> None:
    """Every error as OpenAI's error object; an unexpected exception is a logged 500."""

    @app.exception_handler(ApiError)
    async def api_error(_: Request, error: ApiError) -> JSONResponse:
        # The openai client retries 408, 409, 429 and 5xx twice by default; a request that
        # ran past the time limit would run past it again.
        headers = {"x-should-retry": "false"} if error.status == 504 else None
        return JSONResponse(error.body(), status_code=error.status, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException) -> JSONResponse:
        body = error_body(str(error.detail), "invalid_request_error", None, str(error.status_code))
        return JSONResponse(body, status_code=error.status_code)

    @app.exception_handler(Exception)
    async def fault(request: Request, error: Exception) -> JSONResponse:
        log.exception("server fault on %s %s", request.method, request.url.path)
        message = f"internal server error: {type(error).__name__}: {error}"
        return JSONResponse(error_body(message, "server_error"), status_code=500)


def _install_api_key(app: FastAPI, api_key: str) -> None:
    """Every route but ``GET`` and ``HEAD /health`` answers 401 without ``Authorization: Bearer
    <api_key>`` (compared in constant time)."""
    wanted = f"Bearer {api_key}".encode()

    @app.middleware("http")
    async def authenticate(request: Request, call_next: Any) -> Any:
        is_health = request.url.path == "/health" and request.method in ("GET", "HEAD")
        given = request.headers.get("authorization", "").encode()
        if not is_health and not hmac.compare_digest(given, wanted):
            error = ApiError("missing or wrong API key", status=401, code="invalid_api_key")
            return JSONResponse(error.body(), status_code=401)
        return await call_next(request)


class BackgroundServer:
    """A uvicorn server on a thread (tests, the load check): ``url`` once :meth:`start`
    returns; :meth:`stop` shuts it down. Port 0 picks a free port."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0):
        import uvicorn

        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host, port))
        bound_host, bound_port = self.socket.getsockname()[:2]
        self.url = f"http://{bound_host}:{bound_port}"
        config = uvicorn.Config(app, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True
        )

    def start(self, timeout: float = 30.0) -> BackgroundServer:
        """Start serving; returns when it accepts connections.

        Raises:
            RuntimeError: it did not start within ``timeout`` seconds.
        """
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        """Ask the server to exit and wait for its thread (up to 10 s)."""
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.socket.close()
