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
from typing import Any

from formline.constraint import Constraint, compile_error_message
from formline.grammar.budget import CompileBudget
from formline.grammar.ir import Grammar, GrammarError
from formline.mask.compiled import CompiledGrammar
from formline.mask.compiler import default_cache
from formline.parser.pushdown import build_pushdown
from formline.schema import SchemaError
from formline.vocab import Vocabulary

KEYS = ("formline_json_schema", "formline_regex", "formline_choice", "formline_grammar")
OPTIONS = ("formline_whitespace",)
PREFIX = "formline_"


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


def read_constraint(extra_args: dict[str, Any] | None) -> Constraint | None:
    """The formline constraint in ``extra_args``; ``None`` when it asks for none.

    Raises:
        ValueError: two constraints, an unknown ``formline_*`` key, a value of the wrong type,
            or JSON text that does not parse or nests too deeply (the message names the key).
    Costs a ``json.loads`` of a schema's text.
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
    value = _value(kind, key, ours[key])
    return Constraint(kind, value, whitespace=_whitespace(ours), source=f"vllm_xargs.{key}")


def _value(kind: str, key: str, value: Any) -> Any:
    """``value`` checked for ``kind`` (a schema's or choice list's JSON text read).

    Raises:
        ValueError: a value of the wrong type, JSON text that does not parse, or JSON nested
            past Python's recursion limit (the message names the key).
    """
    if kind in ("json_schema", "choice") and isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            raise ValueError(f"vllm_xargs.{key} is not valid JSON: {error}") from error
        except RecursionError as error:
            # json.loads recurses per nesting level ('[' * 100000): not a ValueError, vLLM
            # answered it with a 500 and an empty message.
            raise ValueError(
                f"vllm_xargs.{key} is JSON nested too deeply to read (past Python's "
                "recursion limit)"
            ) from error
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


def grammar_for(constraint: Constraint) -> Grammar:
    """The tokenizer-free grammar of ``constraint`` (what ``validate_params`` checks).

    Its automaton is built too (no vocabulary needed): left recursion, a grammar that
    matches nothing and a compile limit are found here, in vLLM's API process, where they
    are a 400. Found in the engine's step, an error would stop the engine and every request
    in it.

    Raises:
        ValueError: the schema, regex or grammar does not compile; the message names the
            key and, for a schema, the keyword and JSON pointer.
    Costs milliseconds the first time a grammar is seen for most constraints (the automaton
    is lazy: its start only), a cache lookup after; a hostile schema takes seconds (700
    optional properties under ``maxProperties`` 350: 3.5-6.3 s on 2 cores).
    """
    try:
        grammar = constraint.grammar()
        assert grammar is not None  # read_constraint never makes a text constraint
        default_cache().memoize(
            ("vllm-automaton-built", grammar.fingerprint()), lambda: _build(grammar), len
        )
    except (SchemaError, GrammarError) as error:
        raise ValueError(compile_error_message(error, constraint.source)[0]) from error
    return grammar


def _build(grammar: Grammar) -> str:
    """Build ``grammar``'s automaton within the default budget (what the engine's compile
    does first), and answer what the cache keeps: a word, not the automaton.

    Raises:
        GrammarError: left recursion, or a grammar that matches nothing.
        CompileLimitError: past a limit of the default budget.
    """
    budget = CompileBudget()
    build_pushdown(grammar, *budget.state_limits(), deadline=budget.start())
    return "built"


def compiled_for(constraint: Constraint, vocabulary: Vocabulary) -> CompiledGrammar:
    """The compiled grammar of ``constraint`` for ``vocabulary`` (cached by formline).

    Raises:
        ValueError: as :func:`grammar_for`.
    Costs the automaton build the first time a grammar meets a vocabulary (milliseconds
    for most schemas); masks come lazily.
    """
    try:
        compiled = constraint.compile(vocabulary).compiled
    except (SchemaError, GrammarError) as error:
        raise ValueError(compile_error_message(error, constraint.source)[0]) from error
    assert compiled is not None
    return compiled
