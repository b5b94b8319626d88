"""``formline.generate``: one prompt, one typed value, from a real local model.

The output spec says what the model may write: a Pydantic model or a JSON Schema dict (a
JSON value), :class:`Regex`, :class:`Choice`, a :class:`~formline.grammar.Grammar`, or
``None`` for free text. The grammar is compiled for the backend's vocabulary (cached), the
matcher masks every step, and the result carries the text, why decoding stopped, the value,
and what it cost. A result cut off by ``max_tokens`` never pretends to be a value.

By default the schema is also described in the prompt: the seeds show that a constraint
hurts most where the prompt and the schema disagree (seed 002's results table).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from formline.backends.base import Backend, load_backend
from formline.constraint import Constraint, Plan, field_list_description
from formline.errors import FormlineError
from formline.mask.distinct import DistinctItemsMatcher
from formline.mask.tagged import TaggedMatcher
from formline.pipeline.decoding import Generation, Sampling, decode
from formline.pipeline.grounding import copied_confidence, field_confidence
from formline.pipeline.listeners import StepListener
from formline.pipeline.pressure import (
    DEFAULT_THRESHOLD,
    FieldPressure,
    field_pressure,
    top_level,
)
from formline.pipeline.tolerance import coerce_numbers, tolerant_schema
from formline.pipeline.verbatim import distinct_arrays, narrows_strings, verbatim_schema
from formline.schema.api import SchemaCheck, parse_output

CUT_OFF = ("length", "timeout", "cancelled")
# The defaults, chosen by measurement on extraction-dev with the embedded model (README,
# docs/results/strategies): see the closing note of issue 17 for the table.
DEFAULT_DESCRIBE: bool | str = False
DEFAULT_WHITESPACE: int | None = 16  # a newline and indentation, as SmolLM2 writes JSON
DEFAULT_NUMBERS = "strict"
DEFAULT_THINK = 0
UNREAD: Any = type(
    "Unread", (), {"__repr__": lambda self: "UNREAD"}
)()  # no JSON read  # finish reasons of an output that did not end

_backends: dict[tuple[str, str], Backend] = {}
_backends_lock = threading.Lock()


class TruncatedOutput(FormlineError, ValueError):  # noqa: N818 (the name the API promises)
    """Decoding stopped at ``max_tokens`` before the output was complete, or the budget's
    closing policy wrote its last ``closing_tokens`` tokens (a complete value whose last
    fields are the grammar's shortest, not the model's); ``text`` holds what was written."""

    def __init__(self, text: str, closing_tokens: int = 0):
        self.text = text
        self.closing_tokens = closing_tokens
        if closing_tokens:
            message = (
                f"max_tokens ran out: the last {closing_tokens} tokens were written to close "
                "the output, not by the model (Result.data holds the closed value; raise "
                f"max_tokens): {text[-80:]!r}"
            )
        else:
            message = (
                f"the output was cut off at max_tokens before it was complete ({len(text)} "
                f"characters written; raise max_tokens): {text[:80]!r}"
            )
        super().__init__(message)


class InvalidOutput(FormlineError, ValueError):  # noqa: N818 (pairs with TruncatedOutput)
    """The output broke a constraint the grammar could not enforce (found by the
    after-check), or did not parse in free mode; ``errors`` says how."""

    def __init__(self, text: str, errors: list[str]):
        self.text = text
        self.errors = errors
        super().__init__(f"the output is not valid: {'; '.join(errors)[:300]}")


@dataclass
class Result:
    """What :func:`generate` produced."""

    text: str
    finish_reason: str
    usage: dict[str, int]
    timings: dict[str, float]
    kind: str = "text"  # "json", "model", "text"
    errors: list[str] = field(default_factory=list)
    report: Any = None  # the schema's keyword report, when the output is a schema
    output_model: Any = None
    pressure: dict[str, FieldPressure] = field(default_factory=dict)
    data: Any = UNREAD  # the parsed (and coerced) JSON; UNREAD when none was read
    coerced: list[str] = field(default_factory=list)  # paths of spelled numbers coerced
    rationale: str = ""  # free text written before the answer (think=N)

    source: str = ""  # the prompt's own text (its user messages), what values are checked in
    # Values were narrowed to the source's (generate(verbatim=True)); False for a source too
    # long to narrow strings (verbatim.narrows_strings: numbers and dates still were).
    verbatim: bool = False

    @property
    def model_confidence(self) -> dict[str, float]:
        """Per top-level field: how sure the model itself was of its value, the unmasked
        probability of the least likely content token it chose there (1.0: the grammar
        wrote it all)."""
        return {name: entry.confidence for name, entry in top_level(self.pressure).items() if name}

    @property
    def confidence(self) -> dict[str, float]:
        """Per top-level field, how likely its value is right, in [0, 1]: the share of its
        strings and numbers found in the prompt's text weighted 0.7, the model's own
        probability (:attr:`model_confidence`) 0.3
        (:func:`~formline.pipeline.grounding.field_confidence`). Low values predict wrong
        fields: AUROC 0.84 on the extraction-dev tasks, the model's probability alone
        0.82 (docs/results/verbatim/). Under ``verbatim`` every value is found in the text
        by construction, so the share tells nothing: the confidence is the lower of the
        model's probability and whether the value reads as one value, not a run of text
        (:func:`~formline.pipeline.grounding.copied_confidence`). Costs one pass over the
        prompt per string leaf."""
        values = self.data if isinstance(self.data, dict) else {}
        return {
            name: copied_confidence(values.get(name), probability)
            if self.verbatim
            else field_confidence(values.get(name), self.source, probability)
            for name, probability in self.model_confidence.items()
        }

    def flagged_fields(self, threshold: float = DEFAULT_THRESHOLD) -> list[str]:
        """JSON paths written against the model's preference (see :mod:`.pressure`)."""
        return [path for path, entry in self.pressure.items() if entry.is_flagged(threshold)]

    @property
    def value(self) -> Any:
        """The typed value: a Pydantic instance, a parsed JSON value, or the text.

        Raises:
            TruncatedOutput: decoding stopped before the end (``max_tokens``, or a
                ``Sampling.deadline`` / listener that stopped it), or ``max_tokens`` ran out
                and the closing policy ended the value (``usage["closing_tokens"]``;
                :attr:`data` holds it, checked).
            InvalidOutput: the after-check (or, in free mode, parsing) failed.
        """
        if self.finish_reason in CUT_OFF:
            raise TruncatedOutput(self.text, self.usage.get("closing_tokens", 0))
        if self.errors:
            raise InvalidOutput(self.text, self.errors)
        if self.kind == "model":
            if self.data is not UNREAD:
                return self.output_model.model_validate(self.data)
            return self.output_model.model_validate_json(self.text)
        if self.kind == "json":
            return json.loads(self.text) if self.data is UNREAD else self.data
        return self.text


def backend_for(model: Backend | str | Path | None, backend: str, **options: Any) -> Backend:
    """A backend instance: ``model`` itself if it is one, else a cached load of the model
    path (``None``: the embedded SmolLM2). Loading costs seconds, once per process."""
    if model is not None and not isinstance(model, str | Path):
        return model
    key = (backend, str(model))
    with _backends_lock:
        found = _backends.get(key)
        if found is None:
            found = _backends[key] = load_backend(backend, model, **options)
        return found


def generate(
    prompt: str | list[dict[str, str]],
    output: Any = None,
    model: Backend | str | Path | None = None,
    *,
    backend: str = "llama_cpp",
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
    max_tokens: int = 256,
    describe_schema: bool | str = DEFAULT_DESCRIBE,
    free: bool = False,
    jump_forward: bool = True,
    system: str | None = None,
    whitespace: int | None = DEFAULT_WHITESPACE,
    numbers: str = DEFAULT_NUMBERS,
    think: int = DEFAULT_THINK,
    verbatim: bool = False,
    source: str | None = None,
) -> Result:
    """Generate from ``prompt`` (text or chat messages) under ``output``.

    Args:
        output: a Pydantic model class, a JSON Schema dict, :class:`Regex`,
            :class:`Choice`, a :class:`Grammar`, a :class:`Constraint`, or ``None`` for
            free text.
        model: a backend instance, a GGUF path / Hugging Face directory, or ``None``.
        free: decode without the mask (for comparison); the value is still parsed and
            checked, so a broken free output raises on ``.value``.
        describe_schema: describe a schema in the prompt: ``True`` or ``"schema"`` (its
            compact JSON), ``"fields"`` (a list of its fields), ``False`` (not at all), or
            ``"auto"`` (the field list when the prompt does not name every field).
        whitespace: for a schema, at most this many whitespace bytes between JSON tokens
            (``None``: compact JSON), so the model may indent as it was trained to.
        numbers: ``"tolerant"`` lets the model spell a number (``"thirty-six"``) and
            coerces it after (:mod:`.tolerance`; ``Result.coerced`` names the fields).
        think: let the model write up to this many tokens of free text before the answer
            (:class:`~formline.mask.tagged.TaggedMatcher`); kept as ``Result.rationale``,
            never part of the value. ``max_tokens`` still bounds the answer.
        verbatim: narrow every plain string of a schema to a span of ``source`` and every
            plain number to one it states (:mod:`.verbatim`): for extraction.
        source: the text values are read from (``verbatim``, ``Result.confidence``);
            default: the prompt, or its user messages' contents.

    Raises:
        formline.schema.SchemaError / GrammarError: the output spec does not compile.
        BackendError: the model cannot be loaded.
    Costs one compile (cached) plus one decoding loop.
    """
    request = GenerationRequest.prepare(
        prompt,
        output,
        backend_for(model, backend),
        Sampling(temperature, top_p, seed, max_tokens + max(think, 0), jump_forward),
        describe_schema=describe_schema,
        free=free,
        system=system,
        shaping=Shaping(whitespace, numbers, think, verbatim),
        source=source,
    )
    return request.run()


@dataclass(frozen=True)
class Shaping:
    """How the answer's form is shaped beyond the constraint: JSON whitespace allowed,
    numbers spelled as the model likes (``"tolerant"``), free tokens before the answer."""

    whitespace: int | None = DEFAULT_WHITESPACE
    numbers: str = DEFAULT_NUMBERS
    think: int = DEFAULT_THINK
    verbatim: bool = False  # plain strings and numbers narrowed to the prompt's (.verbatim)

    def __post_init__(self) -> None:
        if self.numbers not in ("strict", "tolerant"):
            raise ValueError(f"numbers must be 'strict' or 'tolerant', not {self.numbers!r}")
        if self.think < 0:
            raise ValueError(f"think must be 0 or more tokens, not {self.think}")

    def constraint(self, output: Any, source: str = "") -> tuple[Constraint, Constraint]:
        """(the constraint to compile, the constraint as given): objects closed where that
        narrows, the whitespace, when tolerant spelled numbers admitted, and when verbatim
        plain values narrowed to the spans and numbers of ``source``."""
        given = Constraint.of(output)
        if not given.is_json:
            return given, given
        compiled = given
        if not isinstance(output, Constraint):  # a Constraint given whole is kept whole
            compiled = replace(given, close_objects=True, whitespace=self.whitespace)
        if self.numbers == "tolerant" and given.kind == "json_schema":
            compiled = replace(compiled, value=tolerant_schema(given.schema()))
        if self.verbatim and given.kind == "json_schema":
            compiled = replace(compiled, value=verbatim_schema(compiled.schema(), source))
        return compiled, given


@dataclass
class GenerationRequest:
    """One prompt under one constraint on one engine, compiled and rendered, ready to
    decode (:meth:`run`); what :func:`generate` and :func:`formline.stream` share."""

    engine: Backend
    plan: Plan
    prompt: str  # rendered by the engine's chat template
    matcher: Any  # a GrammarMatcher, or None (free text, or free=True)
    sampling: Sampling
    compile_seconds: float
    given: Constraint = field(default_factory=Constraint)  # the constraint as the caller gave it
    shaping: Shaping = field(default_factory=lambda: Shaping())
    source: str = ""  # the prompt's own text, before any description: Result.source

    @classmethod
    def prepare(
        cls,
        prompt: str | list[dict[str, str]],
        output: Any,
        engine: Backend,
        sampling: Sampling,
        *,
        describe_schema: bool | str = DEFAULT_DESCRIBE,
        free: bool = False,
        system: str | None = None,
        shaping: Shaping | None = None,
        source: str | None = None,
    ) -> GenerationRequest:
        """Compile ``output`` for the engine (cached) and render the prompt.

        Raises:
            formline.schema.SchemaError / GrammarError: ``output`` does not compile.
        """
        started = time.perf_counter()
        source = prompt_source(prompt) if source is None else source
        compiled, given = (shaping or Shaping()).constraint(output, source)
        plan = compiled.compile(engine.vocabulary)
        if compiled is not given:  # the after-check reads the schema as given
            plan.client_check = SchemaCheck(given.schema())
        compile_seconds = time.perf_counter() - started
        shaping = shaping or Shaping()
        messages = prompt_messages(
            prompt, describe_constraint(given, describe_schema, prompt), system
        )
        if shaping.think and not free:
            messages = ask_to_think(messages)
        matcher: Any = None
        if not free and plan.compiled is not None:
            matcher = (
                TaggedMatcher(plan.compiled, shaping.think) if shaping.think else plan.matcher()
            )
            verbatim = shaping.verbatim and compiled.kind == "json_schema"
            arrays = distinct_arrays(compiled.schema()) if verbatim else {}
            # Copied strings, each once (.verbatim). Not after a rationale: the follower reads
            # JSON from the answer's first byte.
            if arrays and not shaping.think:
                matcher = DistinctItemsMatcher(matcher, arrays)
        rendered = engine.render_chat(messages)
        return cls(
            engine, plan, rendered, matcher, sampling, compile_seconds, given, shaping, source
        )  # fmt: skip

    def run(self, listeners: Sequence[StepListener] = ()) -> Result:
        """Decode (one loop, ``listeners`` watching) and read the result back."""
        generation = decode(self.engine, self.prompt, self.matcher, self.sampling, listeners)
        return self.result(generation)

    def result(self, generation: Generation) -> Result:
        """The :class:`Result` of ``generation``: parsed, coerced and after-checked when
        JSON; a rationale written before the answer is split off."""
        rationale, rationale_bytes = "", 0
        if isinstance(self.matcher, TaggedMatcher):
            rationale, rationale_bytes = self.matcher.rationale, len(self.matcher.rationale_bytes)
            generation = without_rationale(generation, self.matcher.rationale_bytes)
        result = _result(
            generation, self.plan, self.compile_seconds, self.engine.vocabulary.token_bytes,
            self.given, rationale_bytes, tolerant=self.shaping.numbers == "tolerant",
            free=self.matcher is None,
        )  # fmt: skip
        result.rationale = rationale
        result.source = self.source
        # Not free=True, and strings narrowed: past MAX_SPANS they are left free, and the
        # confidence reads the grounded share again, as without verbatim.
        result.verbatim = (
            self.shaping.verbatim and self.matcher is not None and narrows_strings(self.source)
        )
        return result


def prompt_source(prompt: str | list[dict[str, str]]) -> str:
    """The text a prompt gives to read values from: the text itself, or its user messages'
    contents (a system message's instructions and an assistant's example answers are not
    a source)."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(
        str(message.get("content", "")) for message in prompt if message.get("role") == "user"
    )


def without_rationale(generation: Generation, rationale: bytes) -> Generation:
    """``generation`` with the free text written before the answer cut from its text.

    Compared as text, both decoded alike: a rationale whose budget ended inside a character
    (the first token of a split one) is a replacement character in both, where its raw
    bytes were no prefix of the text's re-encoding, and the rationale stayed in the answer
    (then no JSON)."""
    written = rationale.decode("utf-8", errors="replace")
    text = generation.text
    return replace(generation, text=text[len(written) :] if text.startswith(written) else text)


THINK_REQUEST = (
    "Before the JSON, write one short sentence that says what the text states for each "
    "field. Then write the JSON."
)


def ask_to_think(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """``messages`` with the last one asking for a short rationale before the JSON."""
    last = dict(messages[-1])
    last["content"] = f"{last['content']}\n\n{THINK_REQUEST}"
    return [*messages[:-1], last]


def describe_constraint(given: Constraint, style: bool | str, prompt: Any = "") -> str:
    """The prompt's description of the constraint in ``style`` (see :func:`generate`):
    ``"auto"`` lists the fields (``"fields"``) when the prompt (text, or the messages'
    contents) does not name every top-level field of an object schema, else nothing.

    Raises:
        ValueError: an unknown ``style``.
    """
    if style not in (True, False, "schema", "fields", "auto", "none"):
        raise ValueError(
            f"describe_schema must be True, False, 'auto', 'schema' or 'fields', not {style!r}"
        )
    if style == "auto":
        style = "fields" if _has_unnamed_fields(given, prompt) else False
    if style is False or style == "none":
        return ""
    if style == "fields" and given.kind == "json_schema":
        return field_list_description(given.schema())
    return given.describe()


def _has_unnamed_fields(given: Constraint, prompt: Any) -> bool:
    """Whether an object schema has a top-level field the prompt does not name (``unit_price``
    is named by "unit price" too). A bare text ("Ada Lovelace, 36, lives in London.") names
    none, and the list got Ada's age right; over extraction-dev ``"auto"`` still cost 5
    points of fields correct (a field list everywhere: 11), so it is not the default."""
    if given.kind != "json_schema":
        return False
    schema = given.schema()
    names = list(schema.get("properties", {})) if isinstance(schema, dict) else []
    if isinstance(prompt, str):
        text = prompt
    else:
        text = " ".join(str(message.get("content", "")) for message in prompt)
    words = text.casefold()
    return any(
        name.casefold() not in words and name.casefold().replace("_", " ") not in words
        for name in names
    )


def prompt_messages(
    prompt: str | list[dict[str, str]], description: str, system: str | None = None
) -> list[dict[str, str]]:
    """The chat messages of ``prompt`` (text or messages): ``system`` first when given,
    ``description`` (the constraint's, see :meth:`Constraint.describe`) appended to the
    last message."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if system:
        messages.insert(0, {"role": "system", "content": system})
    if description:
        last = dict(messages[-1])
        last["content"] = f"{last['content']}\n\n{description}"
        messages[-1] = last
    return messages


def _result(
    generation: Generation,
    plan: Plan,
    compile_seconds: float,
    token_bytes: Any,
    given: Constraint | None = None,
    rationale_bytes: int = 0,
    tolerant: bool = False,
    free: bool = False,
) -> Result:
    """``given``: the constraint as the caller gave it (its Pydantic model, when the one
    compiled is a rewritten schema); ``tolerant``: spelled numbers are coerced back by its
    schema; ``rationale_bytes``: the free text before the answer, whose tokens are no
    field's; ``free``: decoded without the mask, so a regex's, a choice's or a grammar's
    text is checked against its grammar too."""
    model = plan.constraint.output_model or (given.output_model if given else None)
    errors: list[str] = []
    data: Any = UNREAD
    coerced: list[str] = []
    if generation.finish_reason not in CUT_OFF and plan.is_json:
        instance, errors = parse_output(generation.text)
        if not errors:
            if tolerant and given is not None:
                instance, coerced = coerce_numbers(instance, given.schema())
            data = instance
            errors = plan.check(instance)
            if not errors and model is not None:
                errors = _model_errors(model, instance)
    elif free and plan.compiled is not None and generation.finish_reason not in CUT_OFF:
        errors = _grammar_errors(plan, generation.text)
    # A value the budget's closing policy ended is a cut-off, as the server and extract()
    # report it ("length"): its last fields are the grammar's shortest (on extraction-dev,
    # 8 of 11 such values were wrong), so .value raises; .data keeps it, parsed and checked.
    closed = generation.finish_reason == "stop" and generation.closing_tokens > 0
    return Result(
        text=generation.text,
        finish_reason="length" if closed else generation.finish_reason,
        usage={
            "prompt_tokens": generation.prompt_tokens,
            "completion_tokens": generation.completion_tokens,
            "forward_passes": generation.forward_passes,
            "forward_passes_saved": generation.forward_passes_saved,
            "closing_tokens": generation.closing_tokens,
        },
        timings={
            "compile_seconds": compile_seconds,
            "forward_seconds": generation.forward_seconds,
            "mask_seconds": generation.mask_seconds,
        },
        kind="model" if model is not None else plan.kind,
        errors=errors,
        report=plan.checker.report if plan.checker else None,
        output_model=model,
        data=data,
        coerced=coerced,
        pressure=field_pressure(
            generation.token_ids,
            token_bytes,
            generation.step_pressure,
            generation.step_confidence,
            answer_from=rationale_bytes,
            closing_tokens=generation.closing_tokens,
        ),
    )


def _model_errors(model: Any, instance: Any) -> list[str]:
    """What ``model``'s own validators (``field_validator``, ``model_validator``: code that
    no schema states) say of ``instance``, as the after-check's errors: unchecked, ``.value``
    raised pydantic's ``ValidationError`` where it promises :class:`InvalidOutput`. Costs one
    validation."""
    try:
        model.model_validate(instance)
    except ValidationError as error:
        return [
            f"{'/'.join(map(str, item['loc'])) or '(root)'}: {item['msg']}"
            for item in error.errors()
        ]
    return []


def _grammar_errors(plan: Plan, text: str) -> list[str]:
    """Whether ``text`` (decoded free) is a whole sentence of ``plan``'s regex, choice or
    grammar: free=True promised a check, and a paragraph came back as a choice's value.
    Costs one walk of the text through a fresh matcher."""
    matcher = plan.matcher()
    assert matcher is not None  # plan.compiled is not None
    if not matcher.accept_string(text):
        return [f"the text does not match the {plan.constraint.kind}"]
    if not matcher.can_end():
        return [f"the text ends before the {plan.constraint.kind} does"]
    return []
