"""The FastAPI app of ``formline serve``: an OpenAI-compatible chat completions endpoint.

Routes: ``GET /health``, ``GET /v1/models``, ``POST /v1/chat/completions``. Every error is
OpenAI's error object: 4xx for bad input (:class:`ApiError`, and unknown routes), 500 only
for a real fault, which is logged with its traceback. With ``api_key`` set, ``/v1/*`` needs
``Authorization: Bearer <api_key>``.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from formline.server.engine import Engine
from formline.server.errors import ApiError, error_body
from formline.server.requests import parse_body, parse_chat_request
from formline.server.responses import completion_body
from formline.server.streaming import stream_request

log = logging.getLogger("formline.server")


def create_app(engine: Engine, api_key: str | None = None) -> FastAPI:
    """The app serving ``engine``. Costs nothing until requests arrive."""
    app = FastAPI(title="formline", docs_url=None, redoc_url=None, openapi_url=None)
    started = int(time.time())
    _install_error_handlers(app)
    if api_key:
        _install_api_key(app, api_key)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        busy = engine.lock.locked()
        return {"status": "ok", "model": engine.model_id, "busy": busy, "loops": engine.stats}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        entry = {"id": engine.model_id, "object": "model", "created": started}
        entry["owned_by"] = "formline"
        return {"object": "list", "data": [entry]}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request) -> JSONResponse | StreamingResponse:
        body = parse_body(await request.body(), engine.limits)
        chat = parse_chat_request(body, engine.limits)
        if chat.model != engine.model_id:
            raise ApiError(
                f"the model {chat.model!r} does not exist; this server serves {engine.model_id!r}",
                status=404,
                param="model",
                code="model_not_found",
            )
        if chat.stream:
            events = await stream_request(engine, chat)
            return StreamingResponse(events, media_type="text/event-stream")
        completion = await run_in_threadpool(engine.complete, chat)
        return JSONResponse(completion_body(completion, engine.model_id))

    @app.post("/trace", response_model=None)
    async def trace(request: Request) -> HTMLResponse:
        """Seed 003's explainer for ``{"prompt", "schema"}`` (``free_samples``,
        ``temperature``, ``max_tokens`` optional), recorded now on the served model."""
        body = parse_body(await request.body(), engine.limits)
        prompt, schema = body.get("prompt"), body.get("schema")
        if not isinstance(prompt, str) or not isinstance(schema, dict):
            raise ApiError("/trace needs 'prompt' (a string) and 'schema' (an object)")
        options: dict[str, Any] = {
            key: body[key] for key in ("free_samples", "temperature", "max_tokens") if key in body
        }
        page = await run_in_threadpool(_trace_page, engine, prompt, schema, options)
        return HTMLResponse(page)

    return app


def _trace_page(
    engine: Engine, prompt: str, schema: dict[str, Any], options: dict[str, Any]
) -> str:
    """Record a trace under the engine's lock (one model, one caller at a time)."""
    from formline.schema import SchemaError
    from formline.trace.html import render_trace_html
    from formline.trace.recorder import record_trace

    if not hasattr(engine.backend, "llm"):
        raise ApiError("/trace records on the llama.cpp backend only", param="model")
    options.setdefault("free_samples", 2)
    options.setdefault("max_tokens", 64)
    options.setdefault("temperature", 0.8)
    for key, low, high in (("free_samples", 0, 8), ("max_tokens", 1, 256), ("temperature", 0, 2)):
        value = options[key]
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not low <= value <= high
        ):
            raise ApiError(f"{key} must be a number from {low} to {high}", param=key)
    options["free_samples"], options["max_tokens"] = (
        int(options["free_samples"]),
        int(options["max_tokens"]),
    )
    with engine.lock:
        try:
            trace = record_trace(schema, prompt, engine.backend, field_orders=False, **options)
        except SchemaError as error:
            raise ApiError(f"invalid schema: {error}", param="schema") from error
    return render_trace_html(trace)


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
    """``/v1/*`` answers 401 without ``Authorization: Bearer <api_key>``."""

    @app.middleware("http")
    async def authenticate(request: Request, call_next: Any) -> Any:
        wanted = f"Bearer {api_key}"
        if request.url.path.startswith("/v1/") and (
            request.headers.get("authorization", "") != wanted
        ):
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
