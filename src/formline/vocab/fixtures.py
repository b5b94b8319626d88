"""Paths of the cached test/benchmark tokenizer fixtures (fetched by scripts/fetch_fixtures.py).

Nothing is downloaded here: a missing fixture is an error telling how to fetch it.
The cache directory is ``$FORMLINE_CACHE_DIR`` or ``~/.cache/formline``; fixtures
live in its ``fixtures/`` subdirectory.
"""

from __future__ import annotations

import os
import pathlib

FIXTURE_FILES = {
    "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "qwen2": "ggml-vocab-qwen2.gguf",
    "llama-bpe": "ggml-vocab-llama-bpe.gguf",
    "phi-3": "ggml-vocab-phi-3.gguf",
    "gpt-2": "ggml-vocab-gpt-2.gguf",
    "llama-spm": "ggml-vocab-llama-spm.gguf",
}
"""Fixture name → file name inside ``<cache>/fixtures/``."""

FETCH_HINT = "run `python scripts/fetch_fixtures.py`"


def cache_directory() -> pathlib.Path:
    """Return ``$FORMLINE_CACHE_DIR`` or ``~/.cache/formline`` (not created)."""
    configured = os.environ.get("FORMLINE_CACHE_DIR")
    if configured:
        return pathlib.Path(configured).expanduser()
    return pathlib.Path.home() / ".cache" / "formline"


def fixture_path(name: str) -> pathlib.Path:
    """Return the cached path of fixture ``name`` (one of FIXTURE_FILES).

    Raises KeyError for an unknown name and FileNotFoundError (with the fetch
    command in the message) when the file is not in the cache. Cost: one stat.
    """
    if name not in FIXTURE_FILES:
        raise KeyError(f"unknown fixture {name!r}; known: {', '.join(FIXTURE_FILES)}")
    path = cache_directory() / "fixtures" / FIXTURE_FILES[name]
    if not path.is_file():
        raise FileNotFoundError(f"fixture {name!r} is missing at {path}: {FETCH_HINT}")
    return path


def gbnf_grammar_paths() -> list[pathlib.Path]:
    """llama.cpp's example GBNF grammars from the fixture cache (``fixtures/gbnf/*.gbnf``).

    Raises FileNotFoundError (with the fetch command) when none are cached.
    """
    directory = cache_directory() / "fixtures" / "gbnf"
    paths = sorted(directory.glob("*.gbnf"))
    if not paths:
        raise FileNotFoundError(f"llama.cpp GBNF grammars are missing in {directory}: {FETCH_HINT}")
    return paths
