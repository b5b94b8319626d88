"""formline inside vLLM: a batch-level (v1) logits processor, one matcher per request.

Start vLLM with ``--logits-processors formline.backends.vllm:FormlineLogitsProcessor``
(formline declares no entry point that loads it by itself: without the flag vLLM ignores
the constraint keys and decodes unconstrained, docs/vllm.md), then ask for a constraint per
request through ``vllm_xargs`` (the OpenAI server) or ``SamplingParams(extra_args=...)``
(offline), one of the keys in :data:`~formline.backends.vllm.constraints.KEYS`. Requests
without them pass untouched.

:mod:`.constraints` reads a request's constraint and imports nothing from vLLM;
:mod:`.processor` (imported on first use of :class:`FormlineLogitsProcessor`) is the vLLM
adapter and imports vLLM and torch.
"""

from __future__ import annotations

from typing import Any

from formline.backends.vllm.constraints import (
    KEYS,
    read_constraint,
    vllm_xargs,
)

__all__ = ["KEYS", "FormlineLogitsProcessor", "read_constraint", "vllm_xargs"]


def __getattr__(name: str) -> Any:
    # vLLM resolves "formline.backends.vllm:FormlineLogitsProcessor" with getattr: the
    # processor (and vLLM, torch) loads only then.
    if name == "FormlineLogitsProcessor":
        from formline.backends.vllm.processor import FormlineLogitsProcessor

        return FormlineLogitsProcessor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
