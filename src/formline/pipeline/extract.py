"""``formline.extract``: seed 000's repair loop, made real.

Constrained decoding guarantees the form of the output, not the truth of it. ``extract`` wraps
:func:`~formline.pipeline.generate.generate` in the loop seed 000 builds: decode under the
schema, validate (Pydantic, with the source text in the validation context, or the schema's
after-check), check that values are grounded in the source when asked, and retry only when
the retry changes an input that matters:

* a truncated output (``finish_reason == "length"``, or JSON the budget's closing policy
  ended: ``usage["closing_tokens"]``) gets a larger token budget (doubled, capped at
  ``BUDGET_GROWTH_LIMIT`` times ``max_tokens``; at the cap the loop stops);
* a validation or grounding error goes back to the model: the rejected answer becomes the
  assistant turn and a user turn lists the errors;
* an output identical to one already rejected stops the loop at once: nothing changed, and
  at temperature 0 nothing will.

The loop ends with an :class:`Extraction` or a typed :class:`Failed`, never a guess.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, NoReturn

from formline.backends.base import Backend
from formline.errors import FormlineError
from formline.pipeline.escape_hatches import apply_escape_hatches, follow_reference
from formline.pipeline.generate import UNREAD, backend_for, generate
from formline.pipeline.grounding import ground
from formline.pipeline.pressure import DEFAULT_THRESHOLD, FieldPressure
from formline.schema.api import parse_output, schema_of

BUDGET_GROWTH_LIMIT = 4  # a truncated output may grow the budget to 4 x max_tokens
MAX_FEEDBACK_ERRORS = 6  # errors listed in one repair turn
MAX_ERROR_CHARACTERS = 200  # per listed error
DEFAULT_INSTRUCTION = (
    "Extract the requested fields from the text below as JSON. "
    "Use only information stated in the text."
)

LEAF_TYPES = frozenset({"string", "number", "integer"})

REPEATED_OUTPUT = "repeated output"
ATTEMPTS_EXHAUSTED = "attempts exhausted"
TOKEN_CAP = "truncated at the token cap"

ACCEPTED = "accepted"
TRUNCATED = "truncated"
INVALID = "invalid"
UNGROUNDED = "ungrounded"
REPEATED = "repeated"


@dataclass
class Attempt:
    """One decoding of the loop. ``outcome`` is ``"accepted"``, ``"truncated"``,
    ``"invalid"`` (parse, schema or Pydantic validation), ``"ungrounded"`` or ``"repeated"``;
    ``tokens`` counts prompt plus completion (``completion_tokens`` the latter alone);
    ``max_tokens`` is the budget it ran under."""

    text: str
    finish_reason: str
    errors: list[str]
    tokens: int
    seconds: float
    max_tokens: int = 0
    outcome: str = ""
    completion_tokens: int = 0
    pressure: dict[str, FieldPressure] = field(default_factory=dict)
    rationale: str = ""  # free text written before the answer (``think=N``), never the value


@dataclass
class Extraction:
    """A value that passed every check. ``value`` is the Pydantic instance, or the parsed JSON
    (a dict for object schemas, and for a Pydantic model whose schema escape hatches changed).
    ``usage`` (``prompt_tokens``, ``completion_tokens``, ``total_tokens``) sums every
    attempt; ``seconds`` is the wall time of the whole loop."""

    value: Any
    attempts: list[Attempt]
    usage: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    ok: ClassVar[bool] = True

    @property
    def pressure(self) -> dict[str, FieldPressure]:
        """Constraint pressure per JSON path of the accepted attempt (see
        :mod:`formline.pipeline.pressure`)."""
        return self.attempts[-1].pressure

    def flagged_fields(self, threshold: float = DEFAULT_THRESHOLD) -> list[str]:
        """Paths the accepted attempt wrote against the model's preference."""
        return [path for path, entry in self.pressure.items() if entry.is_flagged(threshold)]


@dataclass
class Failed:
    """No value passed the checks. ``reason`` is ``"repeated output"``, ``"attempts
    exhausted"`` or ``"truncated at the token cap"``; ``attempts`` holds every try (the last
    one's ``outcome`` and ``errors`` say what went wrong last). Not an exception: see
    :meth:`raise_`."""

    reason: str
    attempts: list[Attempt]
    usage: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    ok: ClassVar[bool] = False

    @property
    def errors(self) -> list[str]:
        """The errors of the last attempt."""
        return self.attempts[-1].errors if self.attempts else []

    def raise_(self) -> NoReturn:
        """Raise :class:`ExtractionFailed` carrying this result."""
        raise ExtractionFailed(self)


class ExtractionFailed(FormlineError, ValueError):  # noqa: N818 (pairs with TruncatedOutput, InvalidOutput)
    """Raised by :meth:`Failed.raise_`; ``failed`` is the :class:`Failed` result."""

    def __init__(self, failed: Failed):
        self.failed = failed
        last = "; ".join(failed.errors)[:300]
        super().__init__(
            f"extraction failed ({failed.reason}) after {len(failed.attempts)} attempts: {last}"
        )


@dataclass
class _Target:
    """What the loop decodes under and validates against."""

    schema: dict[str, Any]
    model: Any = None  # the Pydantic model to validate through; None: the schema's check
    ground_fields: list[str] | None = None
    ground: bool = False


@dataclass
class _Loop:
    """The running state of one extraction."""

    budget: int
    cap: int
    attempts: list[Attempt] = field(default_factory=list)
    rejected: dict[str, int] = field(default_factory=dict)  # text -> attempt number
    started: float = field(default_factory=time.perf_counter)


def extract(
    source: str,
    output: Any,
    model: Backend | str | Path | None = None,
    *,
    instruction: str | None = None,
    ground: bool | Iterable[str] = False,
    max_attempts: int = 3,
    max_tokens: int = 256,
    escape_hatches: bool | Iterable[str] = False,
    backend: str = "llama_cpp",
    verbatim: bool = True,
    **sampling: Any,
) -> Extraction | Failed:
    """Extract ``output`` (a Pydantic model class or a JSON Schema dict) from ``source``.

    Args:
        model: a backend instance, a model path, or ``None`` for the embedded SmolLM2.
        instruction: what to extract; the prompt is the instruction, a blank line, the source.
        ground: ``True`` checks every string and number leaf against ``source`` except
            enum and const ones (:func:`grounded_leaf_paths`); an iterable checks those
            field paths (``"age"``, ``"items[].unit_price"``; a path also selects what is
            under it; see :func:`formline.pipeline.grounding.ground`). Free-text and
            normalised fields (a summary, an ISO date) are rarely verbatim in the source:
            list the fields to check rather than ``True`` for such schemas.
        escape_hatches: ``True`` makes every required scalar nullable and gives every string
            enum an ``"other"`` plus a reason field; an iterable does so for those field paths
            (see :mod:`formline.pipeline.escape_hatches`). A Pydantic model whose schema a
            hatch changed is validated against the changed schema and the value is a dict
            (its validators do not run: the model cannot hold a null or an "other").
        verbatim: plain strings, numbers and dates can only be what ``source`` writes
            (not the instruction): spans of its text, numbers and dates it states, each
            string of an array once, and a rating scale left free (:mod:`.verbatim`). The
            default, as measured on the extraction-dev tasks under this instruction: fields
            43.5% -> 53.2%, tasks all right 22.2% -> 27.8% (docs/results/verbatim/);
            ``False`` for a field the model must write itself (a summary in its own words)
            when it has no ``format`` or ``pattern`` to keep it free.
        sampling: passed to :func:`generate` (``temperature``, ``top_p``, ``seed``,
            ``system``, ``describe_schema``, ``think``, ...). With ``think=N`` each attempt
            may write N tokens of free rationale first (kept in ``Attempt.rationale``).

    A Pydantic model validates with ``context={"source": source}``, so a validator can read
    ``info.context["source"]``. Returns an :class:`Extraction` or a :class:`Failed`.

    Raises:
        ValueError: ``max_attempts`` or ``max_tokens`` below 1.
        formline.schema.SchemaError: the schema does not compile, or a field path names no
            field.
        BackendError: the model cannot be loaded.
        Whatever a user validator raises besides ``ValueError`` / ``AssertionError``.
    Costs up to ``max_attempts`` decoding loops and one schema compile (cached; with
    ``verbatim`` the narrowed schema is new for each source, so it is compiled per call).
    """
    if max_attempts < 1 or max_tokens < 1:
        raise ValueError("max_attempts and max_tokens must be at least 1")
    engine = backend_for(model, backend)
    target = _target(output, ground, escape_hatches)
    first_turn = f"{instruction or DEFAULT_INSTRUCTION}\n\n{source}"
    messages = [{"role": "user", "content": first_turn}]
    loop = _Loop(budget=max_tokens, cap=max_tokens * BUDGET_GROWTH_LIMIT)
    # Values are read from the source only: the instruction is not one ("Extract the
    # requested fields from the text below" was copied as a router's reply on 3 of 12
    # extraction-dev tasks), and the feedback turns quote the rejected values.
    sampling = {**sampling, "verbatim": verbatim, "source": source}
    for _ in range(max_attempts):
        attempt, value = _attempt(messages, target, engine, source, loop.budget, sampling)
        number = len(loop.attempts) + 1
        loop.attempts.append(attempt)
        if attempt.outcome != ACCEPTED and attempt.text in loop.rejected:
            attempt.outcome = REPEATED
            first = loop.rejected[attempt.text]
            attempt.errors = [f"identical to attempt {first}, already rejected", *attempt.errors]
            return _failed(REPEATED_OUTPUT, loop)
        if attempt.outcome == ACCEPTED:
            return Extraction(value, loop.attempts, _usage(loop.attempts), _since(loop))
        loop.rejected[attempt.text] = number
        if attempt.outcome == TRUNCATED:
            if loop.budget >= loop.cap:
                return _failed(TOKEN_CAP, loop)
            loop.budget = min(loop.budget * 2, loop.cap)
        else:
            messages = repair_messages(first_turn, attempt.text, attempt.errors)
    return _failed(ATTEMPTS_EXHAUSTED, loop)


def _shortened(error: str) -> str:
    """``error`` in at most :data:`MAX_ERROR_CHARACTERS`, cut in the middle: its end names
    what failed and where ("... is too long (at /summary)"), and a cut at the end sent the
    model the quoted value alone."""
    if len(error) <= MAX_ERROR_CHARACTERS:
        return error
    tail = MAX_ERROR_CHARACTERS // 3
    return f"{error[: MAX_ERROR_CHARACTERS - tail - 5]} ... {error[-tail:]}"


def repair_messages(first_turn: str, answer: str, errors: list[str]) -> list[dict[str, str]]:
    """The chat for a retry: the original request, the rejected answer as the assistant
    turn, and a user turn listing (at most ``MAX_FEEDBACK_ERRORS``) errors."""
    listed = [f"- {_shortened(error)}" for error in errors[:MAX_FEEDBACK_ERRORS]]
    if len(errors) > MAX_FEEDBACK_ERRORS:
        listed.append(f"- and {len(errors) - MAX_FEEDBACK_ERRORS} more")
    feedback = (
        "Your answer was rejected:\n"
        + "\n".join(listed)
        + "\nAnswer again with corrected JSON, using only what the text states."
    )
    return [
        {"role": "user", "content": first_turn},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": feedback},
    ]


def _target(
    output: Any, ground: bool | Iterable[str], escape_hatches: bool | Iterable[str]
) -> _Target:
    schema = schema_of(output)
    if not isinstance(schema, dict):
        schema = {} if schema else {"not": {}}
    hatched = apply_escape_hatches(schema, _paths_or_flag(escape_hatches))
    is_model = hasattr(output, "model_validate_json") and hasattr(output, "model_json_schema")
    model = output if is_model and hatched == schema else None
    flag = _paths_or_flag(ground)
    fields = grounded_leaf_paths(hatched) if isinstance(flag, bool) else flag
    return _Target(hatched, model, fields, bool(flag))


def grounded_leaf_paths(schema: dict[str, Any]) -> list[str]:
    """The paths (grounding form: ``items[].unit_price``) that ``ground=True`` checks: every
    string and number leaf of ``schema`` except ``enum`` and ``const`` ones, whose values
    are labels the schema defines, not text to find in the source. Costs one schema walk."""
    paths: list[str] = []
    _collect_leaves(schema, schema, "", frozenset(), paths)
    return list(dict.fromkeys(paths))


def _collect_leaves(
    root: dict[str, Any], node: Any, path: str, visiting: frozenset[str], paths: list[str]
) -> None:
    if isinstance(node, dict) and "$ref" in node:
        if node["$ref"] in visiting:  # a recursive schema: stop at the cycle
            return
        visiting = visiting | {node["$ref"]}
        node = follow_reference(root, node)
    if not isinstance(node, dict) or "enum" in node or "const" in node:
        return
    kinds = node.get("type", [])
    kinds = {kinds} if isinstance(kinds, str) else set(kinds)
    if kinds & LEAF_TYPES:
        paths.append(path)
    for name, field_schema in (node.get("properties") or {}).items():
        _collect_leaves(root, field_schema, f"{path}.{name}" if path else name, visiting, paths)
    if isinstance(node.get("items"), dict):
        _collect_leaves(root, node["items"], f"{path}[]", visiting, paths)
    for keyword in ("anyOf", "oneOf", "allOf"):
        branches = node.get(keyword)
        for branch in branches if isinstance(branches, list) else []:
            _collect_leaves(root, branch, path, visiting, paths)


def _paths_or_flag(option: bool | Iterable[str]) -> bool | list[str]:
    if isinstance(option, bool):
        return option
    if isinstance(option, str):
        return [option]
    return list(option)


def _attempt(
    messages: list[dict[str, str]],
    target: _Target,
    engine: Backend,
    source: str,
    budget: int,
    sampling: dict[str, Any],
) -> tuple[Attempt, Any]:
    """Decode once and judge the output: (the attempt, the value when accepted)."""
    started = time.perf_counter()
    result = generate(messages, target.schema, engine, max_tokens=budget, **sampling)
    completion_tokens = result.usage["completion_tokens"]
    tokens = result.usage["prompt_tokens"] + completion_tokens
    value, errors, outcome = None, [], ACCEPTED
    closing = result.usage.get("closing_tokens", 0)
    finish = result.finish_reason  # "length" for a closed value too, as the server says
    if result.finish_reason == "length" and not closing:
        errors = [f"cut off at max_tokens={budget} before the JSON was complete"]
        outcome = TRUNCATED
    elif closing:
        # The budget's closing policy ended the JSON: its last values are the shortest the
        # grammar allows ("total": 1), not the model's (on extraction-dev, 8 of 11 such
        # values were wrong). Accepted, they would be a guess; so it is a cut-off.
        errors = [
            f"max_tokens={budget} ran out: the last {closing} tokens were written to close "
            "the JSON, not by the model"
        ]
        outcome = TRUNCATED
    else:
        value, errors, outcome = _judge(result.text, result.errors, target, source, result.data)
    seconds = time.perf_counter() - started
    attempt = Attempt(
        result.text,
        finish,
        errors,
        tokens,
        seconds,
        budget,
        outcome,
        completion_tokens,
        result.pressure,
        result.rationale,
    )
    return attempt, value


def _judge(
    text: str, after_check: list[str], target: _Target, source: str, data: Any = UNREAD
) -> tuple[Any, list[str], str]:
    """(value, errors, outcome) of a complete output: validation, then grounding. ``data``
    is the JSON as ``generate`` read it (spelled numbers coerced), when it read one."""
    value, errors = _validate(text, after_check, target, source, data)
    grounding_errors: list[str] = []
    if target.ground:
        parsed, unreadable = (data, []) if data is not UNREAD else parse_output(text)
        if not unreadable:  # else the validation errors already say so
            grounding_errors = _grounding_errors(parsed, source, target.ground_fields)
    if errors:
        return None, errors + grounding_errors, INVALID
    if grounding_errors:
        return None, grounding_errors, UNGROUNDED
    return value, [], ACCEPTED


def _validate(
    text: str, after_check: list[str], target: _Target, source: str, data: Any = UNREAD
) -> tuple[Any, list[str]]:
    if target.model is None:
        if after_check:
            return None, list(after_check)
        return (json.loads(text) if data is UNREAD else data), []
    from pydantic import ValidationError

    try:
        if data is not UNREAD:
            return target.model.model_validate(data, context={"source": source}), []
        return target.model.model_validate_json(text, context={"source": source}), []
    except ValidationError as error:
        return None, [_pydantic_message(detail) for detail in error.errors()]


def _pydantic_message(detail: Any) -> str:
    location = ".".join(str(part) for part in detail.get("loc", ()))
    message = str(detail.get("msg", "invalid"))
    return f"{location}: {message}" if location else message


def _grounding_errors(value: Any, source: str, fields: list[str] | None) -> list[str]:
    return [error.message for error in ground(value, source, fields)]


def _usage(attempts: list[Attempt]) -> dict[str, int]:
    total = sum(attempt.tokens for attempt in attempts)
    completion = sum(attempt.completion_tokens for attempt in attempts)
    return {
        "prompt_tokens": total - completion,
        "completion_tokens": completion,
        "total_tokens": total,
    }


def _since(loop: _Loop) -> float:
    return time.perf_counter() - loop.started


def _failed(reason: str, loop: _Loop) -> Failed:
    return Failed(reason, loop.attempts, _usage(loop.attempts), _since(loop))
