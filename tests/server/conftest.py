"""A real ``formline serve`` app (the embedded SmolLM2 on llama.cpp, one thread) on a free
loopback port, shared by the session's tests, and the official ``openai`` client for it.
Needs the ``server`` extra (FastAPI, uvicorn): a missing one fails loudly, never skips."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from formline.server.app import BackgroundServer, create_app
from formline.server.cli import model_id_for
from formline.server.engine import Engine
from formline.server.requests import Limits


@pytest.fixture(scope="session")
def engine(llama_backend: Any) -> Engine:
    """The shared embedded model (``llama_backend``: llama.cpp, one thread) behind a server."""
    limits = Limits(max_request_bytes=200_000, max_tokens_cap=512)
    return Engine(llama_backend, model_id_for(None), limits)


@pytest.fixture(scope="session")
def server(engine: Engine) -> Iterator[BackgroundServer]:
    running = BackgroundServer(create_app(engine)).start()
    yield running
    running.stop()


@pytest.fixture(scope="session")
def client(server: BackgroundServer) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def model(engine: Engine) -> str:
    return engine.model_id
