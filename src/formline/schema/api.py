"""``compile_schema``: a JSON Schema or a Pydantic model, bound to a vocabulary.

The result holds the compiled grammar (for :class:`~formline.mask.GrammarMatcher`), the
report of what each keyword became, and :meth:`CompiledSchema.check`, the after-check that
validates a decoded value against the whole original schema with ``jsonschema`` (format
checking on), so what the grammar could not enforce is still caught.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from referencing.exceptions import Unresolvable

from formline.grammar.budget import CompileBudget, CompileLimitError, Deadline
from formline.grammar.ir import Grammar, GrammarError
from formline.mask.compiled import CompiledGrammar
from formline.mask.compiler import CompileCache, check_vocabulary, default_cache
from formline.mask.matcher import GrammarMatcher
from formline.schema.bounded_patterns import bounded_validation
from formline.schema.compiler import (
    SchemaOptions,
    compile_to_grammar,
    root_resolver,
)
from formline.schema.metaschema import check_schema, draft_validator_class, format_checker
from formline.schema.nesting import check_nesting
from formline.schema.ordering import order_like_schema
from formline.schema.python_patterns import with_python_patterns
from formline.schema.report import PackedReport, SchemaError, SchemaReport
from formline.vocab import Vocabulary


class SchemaCheck:
    """Validation of instances against ``schema`` as formline's after-check does it: the
    schema's own draft validator with that draft's format checker, its patterns read as
    ECMA-262 as the grammar reads them (:mod:`formline.schema.python_patterns`; built on
    first use)."""

    def __init__(self, schema: dict[str, Any] | bool):
        self.schema = schema
        self.validator: Any = None
        self.original_patterns: dict[str, str] = {}

    def check(self, instance: Any) -> list[str]:
        """Every way ``instance`` breaks the schema (``[]``: valid). A check that cannot run
        (a ``$dynamicRef`` to a missing anchor, an instance nested past the recursion limit,
        a pattern Python's ``re`` cannot read) is reported as a finding, never passed. Costs
        one ``jsonschema`` validation (the first call also rewrites the schema's patterns)."""
        try:
            if self.validator is None:
                rewritten, self.original_patterns = with_python_patterns(self.schema)
                self.validator = _validator(rewritten)
            with bounded_validation():
                return [
                    f"{self.message(error)} (at {'/' + '/'.join(map(str, error.absolute_path))})"
                    for error in self.validator.iter_errors(instance)
                ]
        except (Unresolvable, RecursionError, ValueError, re.error) as error:  # jsonschema
            # wraps its reference errors in Unresolvable; an invalid schema is a ValueError.
            return [f"the after-check could not run: {type(error).__name__}: {error}"]

    def message(self, error: Any) -> str:
        """``error``'s message with each pattern named as the schema wrote it (``pattern``'s
        and ``additionalProperties``' messages quote the Python form, which can be kilobytes
        of code point ranges). Costs a scan per rewritten pattern."""
        text = str(error.message)
        for rewritten, original in self.original_patterns.items():
            quoted = repr(rewritten)
            if rewritten != original and quoted in text:
                text = text.replace(quoted, repr(original))
        return text


@dataclass
class CompiledSchema:
    """A schema compiled for one vocabulary: grammar, masks, report and after-check."""

    schema: dict[str, Any] | bool
    grammar: Grammar
    compiled_grammar: CompiledGrammar
    _report: SchemaReport | PackedReport = field(repr=False, compare=False)
    options: SchemaOptions
    _after_check: SchemaCheck | None = field(default=None, repr=False)

    @property
    def report(self) -> SchemaReport:
        """What each keyword became: enforced, checked after, unsupported, ignored. A
        compile cache hit keeps it packed until this first read (unpacking meltano.schema's
        819 keyword uses was 91 µs of its 249 µs hit, and a server's request never reads
        it). Costs O(keyword uses) the first time, nothing after."""
        report = self._report
        if not isinstance(report, SchemaReport):
            report = self._report = SchemaReport.unpack(report)
        return report

    def matcher(self, max_rollback_tokens: int | None = None) -> GrammarMatcher:
        """A fresh matcher (per sequence) over this schema's grammar."""
        return GrammarMatcher(self.compiled_grammar, max_rollback_tokens)

    def check(self, instance: Any) -> list[str]:
        """The after-check: every way ``instance`` breaks the schema (``[]``: valid).

        Validates against the whole schema, not just the keywords reported as checked after,
        so it is also a second opinion on the grammar. Costs one ``jsonschema`` validation.
        """
        if self._after_check is None:
            self._after_check = SchemaCheck(self.schema)
        return self._after_check.check(instance)

    def serialize(self, instance: Any) -> str:
        """The compact JSON text of ``instance`` as the grammar writes it: object keys in
        the schema's declared order (the value is unchanged). Useful for few-shot examples
        and for checking a stored value against the grammar."""
        return serialize_like_schema(self.schema, instance)

    def is_valid(self, instance: Any) -> bool:
        """Whether ``instance`` passes :meth:`check`."""
        return not self.check(instance)


def parse_output(text: str) -> tuple[Any, list[str]]:
    """``(value, [])`` for JSON ``text``, else ``(None, [why])``: not JSON, or nested deeper
    than Python's JSON reader goes (a recursive schema lets 3,000 nested arrays through the
    grammar, and ``json.loads`` raised ``RecursionError`` on them). Costs one parse."""
    try:
        return json.loads(text), []
    except json.JSONDecodeError as error:
        return None, [f"not JSON: {error}"]
    except RecursionError:
        return None, ["the output nests deeper than the JSON reader goes (about 1,000 levels)"]


def serialize_like_schema(schema: dict[str, Any] | bool, instance: Any) -> str:
    """See :meth:`CompiledSchema.serialize`. Costs O(size of instance) plus a walk of the
    schema."""
    # The rewritten schema throughout: the order follows the anyOf branch that holds, and a
    # branch holds by its patterns read as ECMA-262 (handed the original's subschemas, the
    # validator read them as Python).
    rewritten = with_python_patterns(schema)[0]
    resolver, _, is_draft7 = root_resolver(rewritten)
    ordered = order_like_schema(rewritten, instance, resolver, _validator(rewritten), is_draft7)
    return json.dumps(ordered, separators=(",", ":"), ensure_ascii=False)


def schema_of(source: Any) -> dict[str, Any] | bool:
    """The JSON Schema of ``source``: a dict or bool as is, a JSON text parsed, a Pydantic
    model class (or ``TypeAdapter``) through ``model_json_schema``/``json_schema``.

    Raises:
        SchemaError: ``source`` is none of these, or its JSON text does not parse.
    """
    if isinstance(source, dict | bool):
        return source
    if isinstance(source, str):
        try:
            parsed = json.loads(source)
        except json.JSONDecodeError as error:
            raise SchemaError(f"the schema is not valid JSON: {error}") from error
        return schema_of(parsed) if isinstance(parsed, dict | bool) else _not_a_schema(parsed)
    if hasattr(source, "model_json_schema"):
        result: dict[str, Any] = source.model_json_schema()
        return result
    if hasattr(source, "json_schema") and callable(source.json_schema):
        adapted: dict[str, Any] = source.json_schema()
        return adapted
    return _not_a_schema(source)


def _not_a_schema(source: Any) -> dict[str, Any]:
    kind = type(source).__name__
    raise SchemaError(f"expected a JSON Schema (dict, bool, JSON text) or a Pydantic model: {kind}")


def schema_to_grammar(
    source: Any,
    *,
    whitespace: int | None = None,
    on_unsupported: str = "error",
    max_string_length: int | None = None,
    cache: CompileCache | None = None,
    budget: CompileBudget | None = None,
    deadline: Deadline | None = None,
) -> tuple[Grammar, SchemaReport]:
    """The tokenizer-free grammar of a schema, and the report of every keyword.

    Raises:
        SchemaError: not a valid JSON Schema, a ``$ref`` that does not resolve, an
            unsupported keyword (unless ``on_unsupported`` says otherwise), a schema too
            deep or too big, or one past a limit of ``budget`` (time, or a counted
            repetition too large to unroll); the message names the keyword and the JSON
            pointer.
        ValueError: an unknown ``on_unsupported`` or a negative ``max_string_length``.
    Costs milliseconds for typical schemas; cached in memory by the schema's text (in
    ``cache``, default the process-wide :class:`~formline.mask.compiler.CompileCache`).
    """
    options = SchemaOptions(whitespace, on_unsupported, max_string_length)
    running = deadline or (budget or CompileBudget()).start()
    grammar, report = _schema_grammar(source, options, cache, running)
    return grammar, report if isinstance(report, SchemaReport) else SchemaReport.unpack(report)


def schema_grammar(
    source: Any,
    *,
    whitespace: int | None = None,
    on_unsupported: str = "error",
    max_string_length: int | None = None,
    cache: CompileCache | None = None,
    budget: CompileBudget | None = None,
) -> Grammar:
    """The tokenizer-free grammar of a schema without its report: what a caller that reads
    only the grammar needs (a server's tool-calling grammar, vLLM's ``validate_params``, the
    linter). On a cache hit the report stays packed: meltano.schema's ``Constraint.grammar()``
    hit 0.225 ms, 0.351 through :func:`schema_to_grammar` (``python -m bench.policy_bench``).

    Raises:
        SchemaError, ValueError: as :func:`schema_to_grammar`.
    Costs as :func:`schema_to_grammar`, less the report on a cache hit.
    """
    options = SchemaOptions(whitespace, on_unsupported, max_string_length)
    return _schema_grammar(source, options, cache, (budget or CompileBudget()).start())[0]


def _key_of(value: Any) -> Any:
    """A value JSON cannot write, in the cache key with its type (``default=str`` gave
    ``{"const": np.int64(5)}`` the grammar of ``{"const": "5"}``); a ``default`` of a
    ``datetime.date``, an annotation, still compiles."""
    return {"\x00not JSON": [type(value).__module__, type(value).__qualname__, repr(value)]}


def _schema_grammar(
    source: Any, options: SchemaOptions, cache: CompileCache | None, running: Deadline
) -> tuple[Grammar, SchemaReport | PackedReport]:
    """:func:`schema_to_grammar`, a cache hit's report left packed (its caller may never
    read it). Raises and costs as that function does."""
    schema = schema_of(source)
    # Before anything recurses over the schema (json.dumps below does): 1,000 nested
    # objects overflowed the stack in the cache key.
    check_nesting(schema, 2 * options.max_depth)
    # Key order matters: property order is part of the grammar (no sort_keys). The dump's
    # cycle check stays, a second guard: check_nesting refuses a schema that holds itself
    # through the dicts, lists and tuples the dump writes.
    key = json.dumps([schema, repr(options)], default=_key_of)

    built: list[tuple[Grammar, SchemaReport]] = []

    def build() -> tuple[Grammar, PackedReport, int]:
        check_schema(schema)
        grammar, report = compile_to_grammar(schema, options, running)
        built.append((grammar, report))
        packed = report.pack()
        return grammar.compact(), packed, _stored_bytes(len(key), grammar, packed)

    chosen = cache if cache is not None else default_cache()
    # Kept without node objects (a full garbage collection scanned 450 a schema before);
    # a later caller gets a compact grammar and a report of its own. The size is counted
    # once: the cache counts every entry again now and then, and 270 reports' strings
    # counted each time made a compile take 1 ms more.
    stored, packed, _ = chosen.memoize(("schema-grammar", key), build, STORED_SIZE, running)
    if built:  # this call built them: they are its own, and their nodes go with them
        return built[0]
    return stored.compact(), packed


# The size of a cached schema grammar, as counted when it was built.
STORED_SIZE = itemgetter(2)


def _stored_bytes(key_length: int, grammar: Grammar, packed: PackedReport) -> int:
    """About the bytes of a cached schema grammar: its key (the schema's JSON text), its
    arrays, and its report at about 200 bytes a keyword use (three tuples and a pointer's
    text; counting the strings' lengths cost 0.2 ms for meltano.schema's 819). O(rules)."""
    return key_length + grammar.memory_bytes() + 200 * sum(map(len, packed))


def compile_schema(
    source: Any,
    vocabulary: Vocabulary,
    *,
    whitespace: int | None = None,
    on_unsupported: str = "error",
    max_string_length: int | None = None,
    disk_cache: bool | str | os.PathLike[str] = False,
    cache: CompileCache | None = None,
    budget: CompileBudget | None = None,
) -> CompiledSchema:
    """Compile a JSON Schema or Pydantic model for ``vocabulary``.

    Args:
        whitespace: ``None`` for compact JSON, else at most N whitespace bytes between tokens.
        on_unsupported: ``"error"`` (default), ``"check_after"`` or ``"ignore"``.
        max_string_length: optional cap for strings without ``maxLength`` (reported).
        disk_cache: as for :func:`formline.mask.compile_grammar`.
        cache: the :class:`~formline.mask.compiler.CompileCache` that keeps the grammar and
            the compiled grammar (default: the process-wide one for ``disk_cache``).
        budget: time and state limits for the whole compile, grammar and automata
            (default :class:`~formline.grammar.budget.CompileBudget()`, 10 s).

    Raises:
        SchemaError: see :func:`schema_to_grammar`; also when the schema's automaton is over
            a limit of ``budget`` (raised in bounded time; ``error.limit`` names it).
        TypeError: ``vocabulary`` is not a :class:`~formline.vocab.Vocabulary`.
        ValueError: see :func:`schema_to_grammar`.
    Costs the grammar plus the automaton of :func:`~formline.mask.compile_grammar`
    (milliseconds for most schemas; masks come lazily); both are cached.
    """
    check_vocabulary(vocabulary)
    schema = schema_of(source)
    chosen = cache if cache is not None else default_cache(disk_cache)
    budget = budget or CompileBudget()
    deadline = budget.start()
    options = SchemaOptions(whitespace, on_unsupported, max_string_length)
    grammar, report = _schema_grammar(schema, options, chosen, deadline)
    try:
        compiled = chosen.compile(grammar, vocabulary, budget, deadline)
    except CompileLimitError as error:
        raise SchemaError(
            f"the schema's grammar is over a compile limit: {error}", limit=error.limit
        ) from error
    except GrammarError as error:
        raise SchemaError(f"the schema's grammar cannot be compiled: {error}") from error
    return CompiledSchema(schema, grammar, compiled, report, options)


def _validator(schema: dict[str, Any] | bool) -> Any:
    """The schema's own draft validator with that draft's format checker (a bare
    ``FormatChecker()`` mixes drafts: its "time" is draft 3's ``%H:%M:%S``, which refuses
    ``08:30:06Z``), reading ``nullable`` and ``multipleOf`` as the grammar does
    (:func:`~formline.schema.metaschema.draft_validator_class`).

    Raises:
        SchemaError: a ``$schema`` that is not a string."""
    cls = draft_validator_class(schema)
    return cls(schema, format_checker=format_checker(cls))
