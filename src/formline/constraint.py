"""``Constraint``: what the model may write; one type for the library, the server and vLLM.

A constraint is a kind and a value: ``json_schema`` (a schema dict or bool, or a Pydantic
model), ``json_object`` (any JSON object), ``regex``, ``choice`` (one of some strings),
``grammar`` (EBNF text or a :class:`~formline.grammar.Grammar`) or ``text`` (no constraint).
Each front end maps its own fields onto it in one place: ``formline.generate``'s ``output``
(:meth:`Constraint.of`), the server's ``response_format`` / ``guided_*`` / ``tools``
(:mod:`formline.server.requests`) and vLLM's ``vllm_xargs``
(:mod:`formline.backends.vllm.constraints`).

:meth:`Constraint.grammar` is the tokenizer-free grammar (what a front end checks before it
queues a request), :meth:`Constraint.compile` the :class:`Plan` for one vocabulary (the
compiled grammar, the after-check, the prompt's description), :meth:`Constraint.describe`
the text that describes it in a prompt. A failed compile raises the engine's own error
(``SchemaError``, ``GrammarError``, ``CompileLimitError``); :func:`compile_error_message`
words it, once, for every front end.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from formline.compiler import GrammarCompiler
from formline.grammar.budget import CompileBudget, CompileLimitError
from formline.grammar.ir import Grammar, GrammarError
from formline.mask.compiled import CompiledGrammar
from formline.mask.compiler import compile_grammar
from formline.mask.matcher import GrammarMatcher
from formline.schema.api import (
    CompiledSchema,
    SchemaCheck,
    compile_schema,
    schema_grammar,
    schema_of,
)
from formline.schema.closing import close_objects
from formline.schema.compiler import SchemaOptions
from formline.schema.nesting import check_nesting
from formline.schema.report import SchemaError
from formline.vocab import Vocabulary

KINDS = ("text", "json_schema", "json_object", "regex", "choice", "grammar")
JSON_KINDS = ("json_schema", "json_object")
ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class Regex:
    """Output that fully matches a regular expression (formline's regex subset)."""

    pattern: str


@dataclass(frozen=True)
class Choice:
    """Output that is exactly one of ``options``."""

    options: tuple[str, ...]

    def __init__(self, options: list[str] | tuple[str, ...]):
        object.__setattr__(self, "options", tuple(options))


@dataclass(frozen=True, eq=False)
class Constraint:
    """One output constraint (see the module's doc).

    Args:
        kind: one of :data:`KINDS`.
        value: the schema (dict, bool or Pydantic model), pattern, options, or grammar
            (EBNF text or a :class:`Grammar`); ignored for ``text`` and ``json_object``.
        strict: for a schema, an unsupported keyword is an error; otherwise it is checked
            after decoding (and reported as such).
        whitespace: for a schema, at most this many whitespace bytes between JSON tokens
            (``None``: compact JSON).
        close_objects: for a schema, give open objects ``additionalProperties: false``
            where that provably narrows (vLLM's xgrammar default, :mod:`.schema.closing`);
            the after-check then also validates against the schema as given.
        source: where the constraint came from (a request field), for error messages.
    """

    kind: str = "text"
    value: Any = None
    strict: bool = True
    whitespace: int | None = None
    close_objects: bool = False
    source: str = "output"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown constraint kind {self.kind!r}; use one of {KINDS}")

    @classmethod
    def of(cls, output: Any, **options: Any) -> Constraint:
        """The constraint of ``generate``'s ``output``: ``None`` (free text), a
        :class:`Constraint`, :class:`Regex`, :class:`Choice`, :class:`Grammar`, a JSON Schema
        (dict or bool) or a Pydantic model class. ``options`` set the other fields.

        Raises:
            formline.schema.SchemaError: ``output`` is none of these.
        """
        if isinstance(output, Constraint):
            return output
        if output is None:
            return cls("text", **options)
        if isinstance(output, Regex):
            return cls("regex", output.pattern, **options)
        if isinstance(output, Choice):
            return cls("choice", list(output.options), **options)
        if isinstance(output, Grammar):
            return cls("grammar", output, **options)
        schema_of(output)  # raises SchemaError naming what it is when it is not a schema
        return cls("json_schema", output, **options)

    @property
    def is_json(self) -> bool:
        """Whether the output is a JSON value (read back and checked after decoding)."""
        return self.kind in JSON_KINDS

    @property
    def output_model(self) -> Any:
        """The Pydantic model class the value is read into, or ``None``."""
        return self.value if hasattr(self.value, "model_validate_json") else None

    def schema(self) -> dict[str, Any] | bool:
        """The JSON Schema as given (``json_object``: any object).

        Raises:
            ValueError: not a JSON kind. SchemaError: not a schema.
        """
        if self.kind == "json_object":
            return dict(ANY_OBJECT)
        if self.kind != "json_schema":
            raise ValueError(f"a {self.kind} constraint has no JSON Schema")
        return schema_of(self.value)

    def _options(self) -> dict[str, Any]:
        return {
            "whitespace": self.whitespace,
            "on_unsupported": "error" if self.strict else "check_after",
        }

    def _compiled_schema_source(self) -> dict[str, Any] | bool:
        schema = self.schema()
        if not self.close_objects:
            return schema
        # Closing recurses once per level: check the nesting before it does.
        check_nesting(schema, 2 * SchemaOptions().max_depth)
        return close_objects(schema)

    def grammar(self) -> Grammar | None:
        """The tokenizer-free grammar (``None`` for free text).

        Raises:
            SchemaError, GrammarError: it does not compile (see :func:`compile_error_message`).
        Costs milliseconds the first time a schema is seen (cached by its text after).
        """
        if self.kind == "text":
            return None
        if self.is_json:
            return schema_grammar(self._compiled_schema_source(), **self._options())
        if self.kind == "regex":
            return Grammar.from_regex(self.value)
        if self.kind == "choice":
            return Grammar.from_choices(list(self.value))
        return self.value if isinstance(self.value, Grammar) else Grammar.from_ebnf(self.value)

    def describe(self) -> str:
        """The text that describes the constraint at the end of a prompt ("" for none)."""
        if self.kind == "regex":
            return f"Answer with text matching the regex {self.value}"
        if self.kind == "choice":
            return "Answer with exactly one of: " + ", ".join(self.value)
        if self.kind == "json_object":
            return "Answer with a JSON object."
        if self.kind == "json_schema":
            return schema_description(self.schema())
        return ""

    def compile(
        self, target: Vocabulary | GrammarCompiler, budget: CompileBudget | None = None
    ) -> Plan:
        """The :class:`Plan` of this constraint for a vocabulary (or a compiler's).

        Raises:
            SchemaError, GrammarError, CompileLimitError: it does not compile, or goes past
                a limit of ``budget`` (see :func:`compile_error_message`).
        Costs one compile the first time (milliseconds for most schemas), a lookup after.
        """
        if self.kind == "text":
            return Plan(self, None)
        if not self.is_json:
            grammar = self.grammar()
            assert grammar is not None
            if isinstance(target, GrammarCompiler):
                return Plan(self, target.compile_grammar(grammar, budget=budget))
            return Plan(self, compile_grammar(grammar, target, budget=budget))
        source = self._compiled_schema_source()
        if isinstance(target, GrammarCompiler):
            checker = target.compile_json_schema(source, budget=budget, **self._options())
        else:
            checker = compile_schema(source, target, budget=budget, **self._options())
        client = SchemaCheck(self.schema()) if self.close_objects else None
        return Plan(self, checker.compiled_grammar, checker, client)


@dataclass
class Plan:
    """A constraint compiled for one vocabulary, and how its output is read back.

    ``checker``: the after-check of the schema the grammar came from; ``client_check``:
    that of the schema as given, when objects were closed. ``mode`` and ``tool_name`` say
    how the server reads the text (``content``; ``tool_named``, the named tool's arguments;
    ``tool_wrapped``, name/arguments objects; ``tool_auto``, those or free text;
    ``tool_tagged``, free text and calls in the model's own tags). ``tool_format`` names the
    server's tool-call syntax (``json``, ``llama3``, ``hermes``, ``smollm2``).
    """

    constraint: Constraint
    compiled: CompiledGrammar | None
    checker: CompiledSchema | None = None
    client_check: SchemaCheck | None = None
    description: str = field(default="")
    mode: str = "content"
    tool_name: str | None = None
    tool_format: str = "json"

    def __post_init__(self) -> None:
        if not self.description:
            self.description = self.constraint.describe()

    @property
    def is_json(self) -> bool:
        """Whether the output is JSON, read back and checked."""
        return self.constraint.is_json

    @property
    def kind(self) -> str:
        """``model`` (a Pydantic model), ``json`` or ``text``: how the value is read."""
        if self.constraint.output_model is not None:
            return "model"
        return "json" if self.is_json else "text"

    def matcher(self, max_rollback_tokens: int | None = None) -> GrammarMatcher | None:
        """A fresh matcher for one sequence (``None``: nothing to constrain)."""
        if self.compiled is None:
            return None
        return GrammarMatcher(self.compiled, max_rollback_tokens)

    def check(self, instance: Any) -> list[str]:
        """Every way ``instance`` breaks the schema as given, then those only the compiled
        (closed) schema finds (``[]``: valid, or nothing to check). Costs one or two
        ``jsonschema`` validations."""
        found = self.client_check.check(instance) if self.client_check is not None else []
        if self.checker is None:
            return found
        closed = self.checker.check(instance)
        if self.client_check is None:
            return closed
        only_closed = [error for error in closed if error not in found]
        return found + [f"{error} (the schema as compiled)" for error in only_closed]


def schema_description(schema: Any) -> str:
    """The text that describes a JSON Schema in a prompt (its compact JSON)."""
    return f"Answer with a JSON value matching this JSON Schema:\n{compact_json(schema)}"


def field_list_description(schema: Any, limit: int = 60) -> str:
    """A schema described as a list of its fields (name, type, description), the way a
    person would ask for them: a small model copies a JSON Schema's ``title`` and ``type``
    keywords into its values (SmolLM2 wrote ``{"name":"Name","age":20,"type":"integer"}``)
    and has nothing of the kind to copy here. At most ``limit`` lines; local ``$ref``
    followed. Falls back to :func:`schema_description` for a schema that is not an object."""
    root = schema if isinstance(schema, dict) else {}
    if _resolve(root, root).get("type") != "object" and "properties" not in _resolve(root, root):
        return schema_description(schema)
    lines: list[str] = []
    _field_lines(_resolve(root, root), root, "", lines, limit)
    return "Answer with a JSON object with these fields:\n" + "\n".join(lines)


def _resolve(schema: Any, root: dict[str, Any], depth: int = 0) -> dict[str, Any]:
    if not isinstance(schema, dict):
        return {}
    reference = schema.get("$ref")
    if isinstance(reference, str) and reference.startswith("#/") and depth < 8:
        node: Any = root
        for part in reference[2:].split("/"):
            node = node.get(part, {}) if isinstance(node, dict) else {}
        return _resolve(node, root, depth + 1)
    branches = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(branches, list) and branches and "type" not in schema:
        kept = [b for b in branches if _resolve(b, root, depth + 1).get("type") != "null"]
        if len(kept) == 1:
            return _resolve(kept[0], root, depth + 1)
    return schema


def _type_name(schema: dict[str, Any], root: dict[str, Any]) -> str:
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(v, ensure_ascii=False) for v in schema["enum"])
    kind = schema.get("type", "object" if "properties" in schema else "value")
    if isinstance(kind, list):
        kind = " or ".join(str(entry) for entry in kind)
    if kind == "array":
        return "list of " + _type_name(_resolve(schema.get("items", {}), root), root)
    if schema.get("format") in ("date", "date-time", "email", "uri"):
        return f"{kind}, {schema['format']}"
    return str(kind)


def _field_lines(
    schema: dict[str, Any], root: dict[str, Any], indent: str, lines: list[str], limit: int
) -> None:
    required = set(schema.get("required", []))
    for name, sub in schema.get("properties", {}).items():
        if len(lines) >= limit:
            return
        field_schema = _resolve(sub, root)
        about = field_schema.get("description") or (
            sub.get("description") if isinstance(sub, dict) else None
        )
        optional = "" if name in required else ", optional"
        text = f"{indent}- {name} ({_type_name(field_schema, root)}{optional})"
        lines.append(f"{text}: {about}" if about else text)
        nested = field_schema
        if field_schema.get("type") == "array":
            nested = _resolve(field_schema.get("items", {}), root)
        if "properties" in nested and indent.count("  ") < 3:
            _field_lines(nested, root, indent + "  ", lines, limit)


def compact_json(value: Any) -> str:
    """``value`` as compact JSON text (no spaces, non-ASCII kept)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def compile_error_message(error: SchemaError | GrammarError, source: str) -> tuple[str, str]:
    """``(message, code)`` for a constraint from ``source`` that did not compile. The
    message names the source and, for a schema, the keyword, the limit and the JSON pointer;
    the code is ``compile_limit_exceeded``, ``invalid_schema`` or ``invalid_grammar``."""
    if isinstance(error, SchemaError):
        keyword = f" (keyword '{error.keyword}')" if error.keyword else ""
        limit = f" (compile limit '{error.limit}')" if error.limit else ""
        message = (
            f"{source}: the schema cannot be compiled: {error.message}{keyword}{limit} at "
            f"JSON pointer {error.pointer or '/'}"
        )
        return message, "compile_limit_exceeded" if error.limit else "invalid_schema"
    code = "compile_limit_exceeded" if isinstance(error, CompileLimitError) else "invalid_grammar"
    return f"{source} does not compile: {error}", code
