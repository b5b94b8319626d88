"""One backend, many requests: model calls serialized by a lock, one matcher per request.

llama.cpp is not thread-safe, so :meth:`Engine.complete` takes :attr:`Engine.lock` around
each prompt render and decoding loop; compiling a constraint happens outside it (compiled
grammars are shared read-only through formline's caches). The app runs :meth:`complete` in
a worker thread, so ``/health`` answers while the model works.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from formline.backends.base import Backend, BackendError, Generation, Sampling
from formline.mask.matcher import GrammarMatcher
from formline.server.constraints import OutputPlan, plan_output
from formline.server.errors import ApiError
from formline.server.requests import ChatRequest, Limits

log = logging.getLogger("formline.server")


@dataclass
class ChoiceOutput:
    """One generated choice, read back according to the request's output plan."""

    text: str
    finish_reason: str  # stop, length or tool_calls
    tool_call: dict[str, Any] | None = None  # {"id", "type", "function": {name, arguments}}
    errors: list[str] = field(default_factory=list)  # the after-check's findings


@dataclass
class Completion:
    """What one request produced: its choices and the summed token counts."""

    choices: list[ChoiceOutput]
    prompt_tokens: int
    completion_tokens: int


class Engine:
    """A backend shared by every request, with the server's limits and model id."""

    def __init__(self, backend: Backend, model_id: str, limits: Limits):
        self.backend = backend
        self.model_id = model_id
        self.limits = limits
        self.lock = threading.Lock()

    def complete(self, request: ChatRequest) -> Completion:
        """Run ``request``: ``n`` sequential generations under its constraint.

        Raises:
            ApiError: 400 for a constraint that does not compile or a prompt over the
                context; 503 when the model stays busy past ``limits.request_seconds``.
            BackendError: the model failed (a server fault).
        Costs one compile (cached) plus ``n`` decoding loops; waits for the lock first.
        A decoding loop once started is not interrupted (``max_tokens`` bounds it).
        """
        deadline = time.monotonic() + self.limits.request_seconds
        plan = plan_output(request, self.backend.vocabulary)
        messages = _with_description(request.messages, plan.description)
        choices, prompt_tokens, completion_tokens = [], 0, 0
        for index in range(request.n):
            seed = None if request.seed is None else request.seed + index
            sampling = Sampling(request.temperature, request.top_p, seed, request.max_tokens)
            generation = self._generate(messages, plan, sampling, deadline)
            prompt_tokens = generation.prompt_tokens
            completion_tokens += generation.completion_tokens
            choices.append(read_choice(generation, plan))
        return Completion(choices, prompt_tokens, completion_tokens)

    def _generate(
        self, messages: list[dict[str, str]], plan: OutputPlan, sampling: Sampling, deadline: float
    ) -> Generation:
        matcher = GrammarMatcher(plan.compiled) if plan.compiled is not None else None
        if not self.lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise ApiError(
                f"the model stayed busy past this server's {self.limits.request_seconds} s "
                "per request; retry later",
                status=503,
                code="timeout",
                error_type="server_busy",
            )
        try:
            prompt = self.backend.render_chat(messages)
            return self.backend.generate(prompt, matcher, sampling)
        except BackendError as error:
            if "n_ctx" in str(error):
                raise ApiError(
                    str(error), param="messages", code="context_length_exceeded"
                ) from error
            raise
        finally:
            self.lock.release()


def _with_description(messages: list[dict[str, str]], description: str) -> list[dict[str, str]]:
    """The messages with the constraint described at the end of the last one (seed 002:
    a constraint hurts most where the prompt and the schema disagree)."""
    if not description:
        return messages
    last = dict(messages[-1])
    last["content"] = f"{last['content']}\n\n{description}"
    return [*messages[:-1], last]


def read_choice(generation: Generation, plan: OutputPlan) -> ChoiceOutput:
    """The choice a generation makes under ``plan``: its content or tool call, the after-check.

    A cut-off output (``length``) is returned as text, never as a tool call or checked value.
    """
    text, finish = generation.text, generation.finish_reason
    if finish == "length" or not plan.is_json:
        return ChoiceOutput(text, finish)
    if plan.mode == "tool_auto" and not text.startswith("{"):
        return ChoiceOutput(text, finish)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        return ChoiceOutput(text, finish, errors=[f"not JSON: {error}"])
    errors = plan.checker.check(value) if plan.checker is not None else []
    if errors:
        log.warning("an output failed the after-check: %s", "; ".join(errors)[:300])
    if plan.mode == "content":
        return ChoiceOutput(text, finish, errors=errors)
    if plan.mode == "tool_named":
        name, arguments = plan.tool_name, text
    else:
        name = value.get("name")
        arguments = json.dumps(value.get("arguments"), separators=(",", ":"), ensure_ascii=False)
    call = {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }
    return ChoiceOutput("", "tool_calls", call, errors)
