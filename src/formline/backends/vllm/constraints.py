"""A vLLM request's formline constraint, read from its ``extra_args`` (``vllm_xargs``).

vLLM's OpenAI server copies a request's ``vllm_xargs`` object into
``SamplingParams.extra_args``; its values may be strings, numbers or lists, not objects, so
a JSON Schema travels as JSON text. One of these keys asks for formline:

================================  =============================================
``formline_json_schema``          a JSON Schema, as JSON text (or a dict offline)
``formline_regex``                a regular expression the whole output matches
``formline_choice``               a list of strings (or JSON text of one)
``formline_grammar``              formline EBNF (GBNF plus ``/regex/`` terminals)
================================  =============================================

``formline_whitespace`` (an integer) allows that many whitespace bytes between JSON
tokens (default: compact JSON). Any other ``formline_*`` key is an error, never ignored.

Nothing here imports vLLM: the processor's ``validate_params`` calls :func:`read_constraint`
and :func:`grammar_for` in vLLM's API process (a bad constraint is a 400 before the
request is queued), and :func:`compiled_for` in the engine process. Both compile through
formline's caches (the grammar per constraint, the masks per grammar and vocabulary).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from formline.grammar.ir import Grammar, GrammarError
from formline.mask.compiled import CompiledGrammar
from formline.mask.compiler import compile_grammar
from formline.schema import SchemaError, compile_schema, schema_to_grammar
from formline.vocab import Vocabulary

KEYS = ("formline_json_schema", "formline_regex", "formline_choice", "formline_grammar")
OPTIONS = ("formline_whitespace",)
PREFIX = "formline_"


@dataclass(frozen=True)
class RequestConstraint:
    """One request's constraint: ``kind`` (json_schema, regex, choice, grammar), its
    ``value`` (the schema object, pattern, options or grammar text) and ``whitespace``."""

    kind: str
    value: Any
    whitespace: int | None = None

    @property
    def key(self) -> str:
        """The ``extra_args`` key it came from (for error messages)."""
        return f"{PREFIX}{self.kind}"


def vllm_xargs(
    *,
    json_schema: Any = None,
    regex: str | None = None,
    choice: list[str] | None = None,
    grammar: str | None = None,
    whitespace: int | None = None,
) -> dict[str, Any]:
    """The ``vllm_xargs`` of a request constrained by one of the arguments, e.g.
    ``client.chat.completions.create(..., extra_body={"vllm_xargs": vllm_xargs(json_schema=
    Person.model_json_schema())})``. A schema is sent as JSON text (vLLM's ``vllm_xargs``
    takes strings, numbers and lists).

    Raises:
        ValueError: not exactly one constraint given.
    """
    given: dict[str, Any] = {
        "formline_json_schema": None if json_schema is None else json.dumps(json_schema),
        "formline_regex": regex,
        "formline_choice": choice,
        "formline_grammar": grammar,
    }
    chosen = {key: value for key, value in given.items() if value is not None}
    if len(chosen) != 1:
        raise ValueError("give exactly one of json_schema, regex, choice and grammar")
    if whitespace is not None:
        chosen["formline_whitespace"] = whitespace
    return chosen


def read_constraint(extra_args: dict[str, Any] | None) -> RequestConstraint | None:
    """The formline constraint in ``extra_args``; ``None`` when it asks for none.

    Raises:
        ValueError: two constraints, an unknown ``formline_*`` key, or a value of the wrong
            type (the message names the key). Costs a ``json.loads`` of a schema's text.
    """
    if not extra_args:
        return None
    ours = {key: value for key, value in extra_args.items() if key.startswith(PREFIX)}
    unknown = sorted(set(ours) - set(KEYS) - set(OPTIONS))
    if unknown:
        raise ValueError(f"vllm_xargs.{unknown[0]} is not a formline key; use one of {KEYS}")
    asked = [key for key in KEYS if key in ours]
    if len(asked) > 1:
        raise ValueError(f"vllm_xargs has {asked[0]} and {asked[1]}: give one constraint")
    if not asked:
        if ours:
            raise ValueError(f"vllm_xargs.{next(iter(ours))} needs one of {KEYS}")
        return None
    key = asked[0]
    kind = key.removeprefix(PREFIX)
    return RequestConstraint(kind, _value(kind, key, ours[key]), _whitespace(ours))


def _value(kind: str, key: str, value: Any) -> Any:
    if kind in ("json_schema", "choice") and isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            raise ValueError(f"vllm_xargs.{key} is not valid JSON: {error}") from error
    if kind == "json_schema" and not isinstance(value, dict | bool):
        raise ValueError(f"vllm_xargs.{key} must be a JSON Schema (an object or a boolean)")
    if kind == "choice" and (
        not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value)
    ):
        raise ValueError(f"vllm_xargs.{key} must be a non-empty list of strings")
    if kind in ("regex", "grammar") and (not isinstance(value, str) or not value):
        raise ValueError(f"vllm_xargs.{key} must be a non-empty string")
    return value


def _whitespace(ours: dict[str, Any]) -> int | None:
    value = ours.get("formline_whitespace")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 64:
        raise ValueError("vllm_xargs.formline_whitespace must be an integer from 0 to 64")
    return value


def grammar_for(constraint: RequestConstraint) -> Grammar:
    """The tokenizer-free grammar of ``constraint`` (what ``validate_params`` checks).

    Raises:
        ValueError: the schema, regex or grammar does not compile; the message names the
            key and, for a schema, the keyword and JSON pointer.
    Costs milliseconds the first time a schema is seen (schema_to_grammar's cache after).
    """
    try:
        if constraint.kind == "json_schema":
            grammar, _ = schema_to_grammar(constraint.value, whitespace=constraint.whitespace)
            return grammar
        if constraint.kind == "regex":
            return Grammar.from_regex(constraint.value)
        if constraint.kind == "choice":
            return Grammar.from_choices(constraint.value)
        return Grammar.from_ebnf(constraint.value)
    except (SchemaError, GrammarError) as error:
        raise refusal(constraint, error) from error


def compiled_for(constraint: RequestConstraint, vocabulary: Vocabulary) -> CompiledGrammar:
    """The compiled grammar of ``constraint`` for ``vocabulary`` (cached by formline).

    Raises:
        ValueError: as :func:`grammar_for`.
    Costs the mask precompute the first time a grammar meets a vocabulary (milliseconds to
    a second or so for a large schema; the disk cache keeps it across restarts).
    """
    try:
        if constraint.kind == "json_schema":
            schema = compile_schema(constraint.value, vocabulary, whitespace=constraint.whitespace)
            return schema.compiled_grammar
        return compile_grammar(grammar_for(constraint), vocabulary)
    except (SchemaError, GrammarError) as error:
        raise refusal(constraint, error) from error


def refusal(constraint: RequestConstraint, error: SchemaError | GrammarError) -> ValueError:
    """The ValueError (a 400 from vLLM) naming the key, and for a schema the keyword and
    JSON pointer."""
    if isinstance(error, SchemaError):
        where = f" (keyword '{error.keyword}')" if error.keyword else ""
        return ValueError(
            f"vllm_xargs.{constraint.key}: {error.message}{where} at JSON pointer "
            f"{error.pointer or '/'}"
        )
    return ValueError(f"vllm_xargs.{constraint.key} does not compile: {error}")
