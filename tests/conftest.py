"""Shared pytest fixtures.

Tokenizer fixtures come from the formline cache (``python scripts/fetch_fixtures.py``
puts them there). A missing file makes the requesting test ERROR with that command
in the message; nothing is skipped silently and nothing is downloaded here.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import sys
from typing import Any

import pytest

try:
    import formline.vocab  # noqa: F401  (installed, or on PYTHONPATH)
except ImportError:  # running from a plain checkout: use the src layout directly
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "src"))

from formline.vocab import Vocabulary
from formline.vocab.fixtures import fixture_path

# tests/with_vllm is a separate target: vLLM pins transformers<5.20, llguidance<1.8 and
# xgrammar==0.2.8, so it runs in vLLM's own environment (python3 scripts/vllm_env.py test,
# which CI runs too). Where vLLM is importable, as there, the directory is collected.
collect_ignore = [] if importlib.util.find_spec("vllm") is not None else ["with_vllm"]

# Set by .ci/run, which installs everything a test may skip for (chromium, the extras): there
# a skip would hide a test that never ran, so it fails, naming what was missing.
EVERY_TEST_RUNS = os.environ.get("FORMLINE_EVERY_TEST_RUNS") == "1"


def _as_failure(report: Any) -> None:
    if EVERY_TEST_RUNS and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped where every test must run (FORMLINE_EVERY_TEST_RUNS): {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Any:
    outcome = yield
    _as_failure(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: Any) -> Any:
    outcome = yield  # a module-level importorskip skips at collection
    _as_failure(outcome.get_result())


def load_huggingface_tokenizer(name: str) -> Any:
    """Load the transformers tokenizer of a cached GGUF fixture (imports transformers)."""
    from transformers import AutoTokenizer

    path = fixture_path(name)
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture(scope="session")
def smollm2_vocab() -> Vocabulary:
    return Vocabulary.from_gguf(fixture_path("smollm2"))


@pytest.fixture(scope="session")
def phi3_vocab() -> Vocabulary:
    return Vocabulary.from_gguf(fixture_path("phi-3"))


@pytest.fixture(scope="session")
def qwen2_vocab() -> Vocabulary:
    return Vocabulary.from_gguf(fixture_path("qwen2"))


@pytest.fixture(scope="session")
def smollm2_tokenizer() -> Any:
    return load_huggingface_tokenizer("smollm2")


@pytest.fixture(scope="session")
def phi3_tokenizer() -> Any:
    return load_huggingface_tokenizer("phi-3")


@pytest.fixture(scope="session")
def llama_backend() -> Any:
    """The embedded SmolLM2 model on llama.cpp, one thread (loaded once per session)."""
    from formline.backends import load_backend

    return load_backend("llama_cpp", n_threads=1)
