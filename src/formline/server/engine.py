"""One backend, many requests: model calls serialized by a lock, one matcher per request.

llama.cpp is not thread-safe, so :meth:`Engine.complete` takes :attr:`Engine.lock` around
each prompt render and decoding loop; compiling a constraint (:meth:`Engine.plan`) happens
outside it and under no other lock (compiled grammars are shared read-only through
formline's caches), so a request without a constraint never waits for another's compile.
The app runs both in worker threads, so ``/health`` answers while the model works; it
shows the compiles running (:attr:`Engine.compiling`) and whether the model is held.

``limits.request_seconds`` bounds the whole request from :meth:`Engine.deadline`: a compile
that ends past it (504), the wait for the lock (503 past it) and the decoding, which stops
at the first step past the deadline (504, the lock freed at once). A streaming request
passes a :class:`ChoiceListener` per choice, which sees the tokens as they are decoded and
can stop the loop (a client that went away).

Every JSON answer is checked after decoding against the schema the grammar came from and
against the client's own schema (before objects were closed): a value that fails either, or
is not JSON, is returned with ``finish_reason`` :data:`INVALID_FINISH` (``"error"``) and the
findings in the choice's ``formline_errors``, never as a silent ``"stop"``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, Protocol

from formline.backends.base import Backend, BackendError, ChatTemplateError
from formline.constraint import Plan, compile_error_message
from formline.grammar.budget import CompileLimitError
from formline.mask.tagged import TaggedMatcher
from formline.parser.pushdown import ParserLimitError
from formline.pipeline.decoding import Generation, Sampling, decode
from formline.pipeline.generate import (
    DEFAULT_DESCRIBE,
    ask_to_think,
    describe_constraint,
    prompt_messages,
    without_rationale,
)
from formline.pipeline.listeners import StepListener
from formline.schema.api import parse_output
from formline.server.constraints import plan_output
from formline.server.errors import ApiError
from formline.server.requests import ChatRequest, Limits
from formline.server.tool_formats import FORMATS, ToolFormat, read_tagged

log = logging.getLogger("formline.server")
INVALID_FINISH = "error"  # the finish_reason of an answer that failed the after-check


@dataclass
class ChoiceOutput:
    """One generated choice, read back according to the request's output plan."""

    text: str
    finish_reason: str  # stop, length, tool_calls, or error (INVALID_FINISH)
    # [{"id", "type", "function": {"name", "arguments"}}, ...]: one or several calls
    tool_calls: list[dict[str, Any]] | None = None
    errors: list[str] = field(default_factory=list)  # the after-check's findings
    reasoning: str = ""  # the free rationale before a JSON answer (formline_think)


@dataclass
class Completion:
    """What one request produced: its choices and the summed token counts."""

    choices: list[ChoiceOutput]
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int = 0  # of completion_tokens, the formline_think rationales'


class ChoiceListener(Protocol):
    """Sees one choice being decoded (streaming): :meth:`start` once the model is held and
    the prompt fits its context, :attr:`listener` on the decoding loop (it may stop it),
    :meth:`finish` with the choice as read back."""

    def start(self) -> None: ...

    @property
    def listener(self) -> StepListener: ...

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
        self.compiling = 0  # constraint compiles running now (``/health`` shows it)
        self.describe_schema: bool | str = DEFAULT_DESCRIBE
        # How tool calls are written: the model's own syntax where its template has one
        # (formline serve detects it, tool_formats.detect_tool_format), else formline's JSON.
        self.tool_format: ToolFormat = FORMATS["json"]

    def deadline(self) -> float:
        """The ``time.monotonic()`` by which a request starting now must be answered."""
        return time.monotonic() + self.limits.request_seconds

    def plan(self, request: ChatRequest, deadline: float | None = None) -> Plan:
        """The compiled constraint of ``request`` (see :func:`plan_output`; raises its
        400s, and its 504 past ``deadline``), counted in :attr:`compiling` while it runs.
        Costs one compile the first time a constraint is seen."""
        with self.counting_compile():
            return plan_output(
                request, self.backend.vocabulary, deadline, self.limits.compile_seconds,
                self.tool_format,
            )  # fmt: skip

    @contextmanager
    def counting_compile(self) -> Iterator[None]:
        """Count a compile in :attr:`compiling` for the duration of the ``with`` block."""
        with self.lock_stats:
            self.compiling += 1
        try:
            yield
        finally:
            with self.lock_stats:
                self.compiling -= 1

    def hold_model(self, deadline: float) -> None:
        """Take :attr:`lock` (the caller releases it), waiting until ``deadline`` at most.

        Raises:
            ApiError: 503 when the model is still busy at ``deadline``.
        """
        if not self.lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise ApiError(
                f"the model stayed busy past this server's {self.limits.request_seconds} s "
                "per request; retry later",
                status=503,
                code="timeout",
                error_type="server_busy",
            )

    def complete(
        self,
        request: ChatRequest,
        plan: Plan | None = None,
        listener_for: Callable[[int, Plan], ChoiceListener] | None = None,
        deadline: float | None = None,
    ) -> Completion:
        """Run ``request``: ``n`` sequential generations under its constraint, all by
        ``deadline`` (default: :meth:`deadline` from now).

        ``listener_for(index, plan)``: a listener for each choice (streaming). A choice its
        listener stopped ends the request early (what was decoded is returned). With
        ``formline_think``, the rationale has ``think`` tokens at most and the answer
        ``max_tokens`` (``"length"`` past them), each its own budget.

        Raises:
            ApiError: 400 for a constraint that does not compile or a prompt over the
                context (naming ``request.fields.messages``, or the constraint whose
                description put it over); 503 when the model stays busy past the deadline;
                504 when the compile or the decoding runs past it (the loop stops at its
                next step).
            BackendError: the model failed (a server fault).
        Costs one compile (cached) plus ``n`` decoding loops; waits for the lock first.
        """
        deadline = deadline if deadline is not None else self.deadline()
        plan = plan if plan is not None else self.plan(request, deadline)
        messages = _prompt(request, self._description(plan, request.messages))
        choices, prompt_tokens, completion_tokens, reasoning_tokens = [], 0, 0, 0
        for index in range(request.n):
            seed = None if request.seed is None else request.seed + index
            # The rationale's budget and the answer's: the loop's holds both, and
            # _AnswerBudget holds the answer to max_tokens alone.
            budget = request.max_tokens + request.think
            sampling = Sampling(request.temperature, request.top_p, seed, budget)
            sampling = replace(sampling, deadline=deadline)
            listener = listener_for(index, plan) if listener_for is not None else None
            decoded = self._generate(request, messages, plan, sampling, listener)
            generation = decoded.generation
            prompt_tokens = generation.prompt_tokens
            completion_tokens += generation.completion_tokens
            reasoning_tokens += decoded.reasoning_tokens
            self._count(generation)
            if generation.finish_reason == "timeout":
                raise self._timeout(generation)
            choice = read_choice(generation, plan)
            choice.reasoning = decoded.reasoning
            choices.append(choice)
            if listener is not None:
                listener.finish(choice)
            if generation.finish_reason == "cancelled":
                break
        return Completion(choices, prompt_tokens, completion_tokens, reasoning_tokens)

    def _description(self, plan: Plan, messages: list[dict[str, str]]) -> str:
        """What the prompt says of the constraint: tools are always described (the model
        must know their names); a response schema as :data:`DEFAULT_DESCRIBE` says (by default
        a field list only when the messages do not name the fields: on extraction-dev the
        embedded model was more often right without one, README's strategy table)."""
        if plan.mode != "content" or plan.constraint.kind != "json_schema":
            return plan.description
        return describe_constraint(plan.constraint, self.describe_schema, messages)

    def count_cancelled(self) -> None:
        """Count a loop stopped because its client went away (``/trace`` counts its own)."""
        with self.lock_stats:
            self.stats["cancelled"] += 1

    def _count(self, generation: Generation) -> None:
        with self.lock_stats:
            reason = generation.finish_reason
            if reason == "stop" and generation.closing_tokens:
                reason = "length"  # as read_choice reports it
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
        request: ChatRequest,
        messages: list[dict[str, str]],
        plan: Plan,
        sampling: Sampling,
        listener: ChoiceListener | None,
    ) -> _Decoded:
        """One decoding loop; with ``formline_think``, its rationale split from the answer."""
        matcher: Any = plan.matcher()
        tagged = None
        if request.think and plan.compiled is not None:  # plan_output checked its first byte
            matcher = tagged = TaggedMatcher(plan.compiled, request.think)
        self.hold_model(sampling.deadline if sampling.deadline is not None else time.monotonic())
        try:
            prompt = self.backend.render_chat(messages)
            watchers = _watchers(listener, tagged, request.max_tokens)
            generation = decode(self.backend, prompt, matcher, sampling, watchers)
            if tagged is None:
                return _Decoded(generation)
            return _answer_apart(generation, tagged)
        except ChatTemplateError as error:  # the template's own check refused the messages
            param = request.fields.messages
            raise ApiError(str(error), param=param, code="invalid_messages") from error
        except (CompileLimitError, ParserLimitError) as error:
            # The lazy automaton's states or a walk's stacks past their limit while decoding:
            # the constraint's, named as a compile's would be (it was a 500).
            message, code = compile_error_message(error, plan.constraint.source)
            raise ApiError(message, param=plan.constraint.source, code=code) from error
        except BackendError as error:
            if "n_ctx" in str(error):
                raise self._over_context(error, request, plan) from error
            raise
        finally:
            self.lock.release()

    def _over_context(self, error: BackendError, request: ChatRequest, plan: Plan) -> ApiError:
        """The 400 for a prompt over the context, naming what made it so: the request's
        messages, or the constraint whose description the prompt carries when the messages
        alone fit (a 3,000-entry guided_choice named ``messages``, which held one word).
        Costs one more render and tokenization of the prompt (the lock is held)."""
        bare = self.backend.render_chat(_prompt(request, ""))
        bare_tokens = len(self.backend.tokenize_prompt(bare))
        if bare_tokens >= self.backend.context_size:
            param = request.fields.messages
            return ApiError(f"{param}: {error}", param=param, code="context_length_exceeded")
        source = plan.constraint.source
        return ApiError(
            f"{source}: its description in the prompt takes the prompt past the context "
            f"({error}; {bare_tokens} tokens without it): shorten {source}",
            param=source,
            code="context_length_exceeded",
        )


def _prompt(request: ChatRequest, description: str) -> list[dict[str, str]]:
    """The messages the model is given: the request's, the constraint's ``description``
    and, with ``formline_think``, the request to think appended to the last one."""
    messages = prompt_messages(request.messages, description)
    return ask_to_think(messages) if request.think else messages


class _Decoded(NamedTuple):
    """A decoding loop's generation (without its rationale) and its rationale."""

    generation: Generation
    reasoning: str = ""
    reasoning_tokens: int = 0


def _watchers(
    listener: ChoiceListener | None, tagged: TaggedMatcher | None, max_tokens: int
) -> list[StepListener]:
    """The choice's listeners on the loop; under ``tagged`` (``formline_think``) its answer
    held to ``max_tokens`` tokens."""
    watchers: list[StepListener] = []
    if listener is not None:  # opened once the prompt is known to fit: else a 400
        watchers += [_OpensOnStart(listener.start), listener.listener]
    if tagged is not None:
        watchers.append(_AnswerBudget(tagged, max_tokens))
    return watchers


def _answer_apart(generation: Generation, tagged: TaggedMatcher) -> _Decoded:
    """``generation`` without its rationale, the rationale and its tokens."""
    answer = without_rationale(generation, tagged.rationale_bytes)
    return _Decoded(answer, tagged.rationale, tagged.free_used)


class _AnswerBudget(StepListener):
    """Holds the answer after a ``formline_think`` rationale to ``max_tokens`` tokens: once
    it opens, the loop's budget is the rationale's tokens and ``max_tokens``, and its
    closing policy closes the JSON within it. The loop's budget is the rationale's and the
    answer's together, so a rationale that ended early left its tokens to the answer
    (max_tokens 5 gave an 85-token answer); cut after the loop, the answer came back as a
    fragment (``{"people":[{"name":"Ann","age":3``)."""

    def __init__(self, tagged: TaggedMatcher, max_tokens: int):
        self.tagged, self.answer_tokens = tagged, max_tokens

    def max_tokens(self) -> int | None:
        return self.tagged.free_used + self.answer_tokens if self.tagged.is_answering else None


class _OpensOnStart(StepListener):
    """Sends a streamed choice's opening as decoding begins, once its prompt is known to
    fit the context: opened before, a prompt over it was an error inside a 200 stream."""

    def __init__(self, start: Callable[[], None]):
        self.start = start

    def on_start(self, prompt_tokens: int) -> None:
        self.start()


def read_choice(generation: Generation, plan: Plan) -> ChoiceOutput:
    """The choice a generation makes under ``plan``: its content or tool call, the after-check.

    A cut-off output (``length``, or ``cancelled`` reported as ``length``) is returned as
    text, never as a checked value; under a named tool it is that tool's call with the
    arguments written so far, as OpenAI returns it and as a stream sends it (it was text
    here and a call in the stream). An output whose end the budget's closing
    policy wrote is complete (it parses, as a call too) but says ``length``: its last values
    are the grammar's shortest, not the model's, and a stream has sent its call already.
    A JSON array under ``tools`` is several calls. A JSON answer that is not JSON or fails
    the after-check (see the module's doc) has finish_reason :data:`INVALID_FINISH` and its
    findings in ``errors``.
    """
    text, finish = generation.text, generation.finish_reason
    if finish == "cancelled":
        finish = "length"
    if finish == "length" and plan.mode == "tool_named":
        return ChoiceOutput("", finish, [tool_call(plan.tool_name, text)])
    if finish == "length":
        return ChoiceOutput(text, finish)
    choice = _read_answer(text, finish, plan)
    if generation.closing_tokens and choice.finish_reason != INVALID_FINISH:
        return replace(choice, finish_reason="length")
    return choice


def _read_answer(text: str, finish: str, plan: Plan) -> ChoiceOutput:
    """A complete output's content or calls, checked (:func:`read_choice`)."""
    if not plan.is_json:
        return ChoiceOutput(text, finish)
    if plan.mode == "tool_auto" and not text.startswith(("{", "[")):
        return ChoiceOutput(text, finish)
    if plan.mode == "tool_tagged":
        return _read_tagged(text, finish, plan)
    value, unread = parse_output(text)  # nested past the JSON reader is not JSON here
    if unread:
        return ChoiceOutput(text, INVALID_FINISH, errors=unread)
    errors = plan.check(value)
    if errors:
        log.warning("an output failed the after-check: %s", "; ".join(errors)[:300])
    if plan.mode == "content":
        return ChoiceOutput(text, INVALID_FINISH if errors else finish, errors=errors)
    finish = INVALID_FINISH if errors else "tool_calls"
    if plan.mode == "tool_named":
        return ChoiceOutput("", finish, [tool_call(plan.tool_name, text)], errors)
    calls = value if isinstance(value, list) else [value]
    return ChoiceOutput("", finish, _calls(calls, FORMATS[plan.tool_format]), errors)


def _read_tagged(text: str, finish: str, plan: Plan) -> ChoiceOutput:
    """Free text, then calls in tags (one call per tag, or one list of calls)."""
    form = FORMATS[plan.tool_format]
    try:
        content, bodies = read_tagged(form, text)
    except (ValueError, RecursionError) as error:  # nested past the JSON reader
        return ChoiceOutput(text, INVALID_FINISH, errors=[f"not a tool call: {error}"])
    if bodies is None:
        return ChoiceOutput(text, finish)
    errors = [error for body in bodies for error in plan.check(body)]
    if errors:
        log.warning("a tool call failed the after-check: %s", "; ".join(errors)[:300])
    calls = [call for body in bodies for call in (body if form.list_body else [body])]
    finish = INVALID_FINISH if errors else "tool_calls"
    return ChoiceOutput(content, finish, _calls(calls, form), errors)


def _calls(calls: list[Any], form: ToolFormat) -> list[dict[str, Any]]:
    return [
        tool_call(
            call.get("name"),
            json.dumps(call.get(form.arguments_key), separators=(",", ":"), ensure_ascii=False),
        )
        for call in calls
        if isinstance(call, dict)
    ]


def tool_call(name: str | None, arguments: str) -> dict[str, Any]:
    """OpenAI's tool call object with a fresh ``call_...`` id."""
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }
