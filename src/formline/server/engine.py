"""One backend, many requests: model calls serialized by a lock, one matcher per request.

llama.cpp is not thread-safe, so :meth:`Engine.complete` takes :attr:`Engine.lock` around
each prompt render and decoding loop; compiling a constraint happens outside it (compiled
grammars are shared read-only through formline's caches). The app runs :meth:`complete` in
a worker thread, so ``/health`` answers while the model works.

``limits.request_seconds`` bounds the whole request: the wait for the lock (503 past it)
and the decoding, which stops at the first step past the deadline (504, the lock freed at
once). A streaming request passes a :class:`ChoiceListener` per choice, which sees the
tokens as they are decoded and can stop the loop (a client that went away).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

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
    # [{"id", "type", "function": {"name", "arguments"}}, ...]: one or several calls
    tool_calls: list[dict[str, Any]] | None = None
    errors: list[str] = field(default_factory=list)  # the after-check's findings


@dataclass
class Completion:
    """What one request produced: its choices and the summed token counts."""

    choices: list[ChoiceOutput]
    prompt_tokens: int
    completion_tokens: int


class ChoiceListener(Protocol):
    """Sees one choice being decoded (streaming): :meth:`start` once the model is held,
    :meth:`feed` with each step's new tokens (``False`` stops the loop), :meth:`finish`
    with the choice as read back."""

    def start(self) -> None: ...

    def feed(self, token_ids: list[int]) -> bool: ...

    def finish(self, choice: ChoiceOutput) -> None: ...


class Engine:
    """A backend shared by every request, with the server's limits and model id."""

    def __init__(self, backend: Backend, model_id: str, limits: Limits):
        self.backend = backend
        self.model_id = model_id
        self.limits = limits
        self.lock = threading.Lock()
        self.lock_stats = threading.Lock()
        # Decoding loops by how they ended, and the tokens they wrote (``/health`` shows it).
        self.stats = {"stop": 0, "length": 0, "timeout": 0, "cancelled": 0, "tokens": 0}

    def plan(self, request: ChatRequest) -> OutputPlan:
        """The compiled constraint of ``request`` (see :func:`plan_output`; raises its
        400s). Costs one compile the first time a constraint is seen."""
        return plan_output(request, self.backend.vocabulary)

    def complete(
        self,
        request: ChatRequest,
        plan: OutputPlan | None = None,
        listener_for: Callable[[int, OutputPlan], ChoiceListener] | None = None,
    ) -> Completion:
        """Run ``request``: ``n`` sequential generations under its constraint.

        ``listener_for(index, plan)``: a listener for each choice (streaming). A choice its
        listener stopped ends the request early (what was decoded is returned).

        Raises:
            ApiError: 400 for a constraint that does not compile or a prompt over the
                context; 503 when the model stays busy past ``limits.request_seconds``;
                504 when decoding runs past it (the loop stops at its next step).
            BackendError: the model failed (a server fault).
        Costs one compile (cached) plus ``n`` decoding loops; waits for the lock first.
        """
        deadline = time.monotonic() + self.limits.request_seconds
        plan = plan if plan is not None else self.plan(request)
        messages = _with_description(request.messages, plan.description)
        choices, prompt_tokens, completion_tokens = [], 0, 0
        for index in range(request.n):
            seed = None if request.seed is None else request.seed + index
            sampling = Sampling(request.temperature, request.top_p, seed, request.max_tokens)
            sampling = replace(sampling, deadline=deadline)
            listener = listener_for(index, plan) if listener_for is not None else None
            generation = self._generate(messages, plan, sampling, listener)
            prompt_tokens = generation.prompt_tokens
            completion_tokens += generation.completion_tokens
            self._count(generation)
            if generation.finish_reason == "timeout":
                raise self._timeout(generation)
            choice = read_choice(generation, plan)
            choices.append(choice)
            if listener is not None:
                listener.finish(choice)
            if generation.finish_reason == "cancelled":
                break
        return Completion(choices, prompt_tokens, completion_tokens)

    def _count(self, generation: Generation) -> None:
        with self.lock_stats:
            reason = generation.finish_reason
            self.stats[reason] = self.stats.get(reason, 0) + 1
            self.stats["tokens"] += generation.completion_tokens

    def _timeout(self, generation: Generation) -> ApiError:
        log.warning("a request ran past %s s", self.limits.request_seconds)
        return ApiError(
            f"decoding ran past this server's {self.limits.request_seconds} s per request "
            f"(stopped after {generation.completion_tokens} tokens); lower max_tokens or "
            "start the server with a larger --request-seconds",
            status=504,
            code="timeout",
            error_type="timeout",
        )

    def _generate(
        self,
        messages: list[dict[str, str]],
        plan: OutputPlan,
        sampling: Sampling,
        listener: ChoiceListener | None,
    ) -> Generation:
        matcher = GrammarMatcher(plan.compiled) if plan.compiled is not None else None
        deadline = sampling.deadline if sampling.deadline is not None else time.monotonic()
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
            if listener is not None:
                listener.start()
                sampling = replace(sampling, on_tokens=listener.feed)
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

    A cut-off output (``length``, or ``cancelled`` reported as ``length``) is returned as
    text, never as a tool call or checked value. A JSON array under ``tools`` is several calls.
    """
    text, finish = generation.text, generation.finish_reason
    if finish == "cancelled":
        finish = "length"
    if finish == "length" or not plan.is_json:
        return ChoiceOutput(text, finish)
    if plan.mode == "tool_auto" and not text.startswith(("{", "[")):
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
        return ChoiceOutput("", "tool_calls", [tool_call(plan.tool_name, text)], errors)
    calls = value if isinstance(value, list) else [value]
    entries = [
        tool_call(
            call.get("name"),
            json.dumps(call.get("arguments"), separators=(",", ":"), ensure_ascii=False),
        )
        for call in calls
        if isinstance(call, dict)
    ]
    return ChoiceOutput("", "tool_calls", entries, errors)


def tool_call(name: str | None, arguments: str) -> dict[str, Any]:
    """OpenAI's tool call object with a fresh ``call_...`` id."""
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }
