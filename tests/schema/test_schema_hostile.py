"""Hostile compile inputs end in a clear error within a bound, or compile soundly.

The corpus is :mod:`hostile_inputs`. Every case runs with a fresh in-memory cache (no disk),
so each measures a real compile. The time bound is a hang guard, far above what each takes
(each is well under a second on 2 cores, bench figures in the closing note of issue 15),
not a speed goal: before, several of these ran for minutes or crashed with RecursionError.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from hostile_inputs import GRAMMARS, SCHEMAS, HostileGrammar, HostileSchema, nested

from formline import GrammarCompiler
from formline.grammar.budget import CompileBudget, CompileLimitError, Deadline
from formline.grammar.ir import Grammar, GrammarError
from formline.mask import GrammarMatcher, allocate_token_bitmask, compile_grammar
from formline.mask.compiler import CompileCache
from formline.parser.pushdown import build_pushdown
from formline.schema import SchemaError, compile_schema, schema_of, schema_to_grammar
from formline.vocab import Vocabulary

HANG_GUARD_SECONDS = 30.0
ERRORS = {"SchemaError": SchemaError, "GrammarError": GrammarError, "ValueError": ValueError}


def fresh_cache() -> CompileCache:
    return CompileCache(disk_cache=False)


@pytest.mark.parametrize("case", SCHEMAS, ids=[case.name for case in SCHEMAS])
def test_a_hostile_schema_ends_in_a_clear_error_or_compiles(
    case: HostileSchema, smollm2_vocab: Vocabulary
) -> None:
    started = time.perf_counter()
    options: dict[str, Any] = dict(case.options)
    if case.expect is None:
        compiled = compile_schema(case.schema, smollm2_vocab, cache=fresh_cache(), **options)
        assert compiled.matcher().allowed_token_ids().size > 0
    else:
        kind, fragment = case.expect
        with pytest.raises(ERRORS[kind]) as raised:
            compile_schema(case.schema, smollm2_vocab, cache=fresh_cache(), **options)
        assert fragment in str(raised.value)
    assert time.perf_counter() - started < HANG_GUARD_SECONDS


@pytest.mark.parametrize("case", GRAMMARS, ids=[case.name for case in GRAMMARS])
def test_a_hostile_grammar_ends_in_a_clear_error_or_compiles(
    case: HostileGrammar, smollm2_vocab: Vocabulary
) -> None:
    started = time.perf_counter()

    def build() -> Any:
        grammar = Grammar.from_regex(case.text) if case.kind == "regex" else None
        grammar = grammar or Grammar.from_ebnf(case.text)
        return compile_grammar(grammar, smollm2_vocab, cache=fresh_cache())

    if case.expect is None:
        assert GrammarMatcher(build()).allowed_token_ids().size > 0
    else:
        kind, fragment = case.expect
        with pytest.raises(ERRORS[kind]) as raised:
            build()
        assert fragment in str(raised.value)
    assert time.perf_counter() - started < HANG_GUARD_SECONDS


def test_a_count_too_large_is_checked_after_when_asked(smollm2_vocab: Vocabulary) -> None:
    schema = {"type": "array", "items": {"type": "integer"}, "maxItems": 1_000_000_000}
    compiled = compile_schema(
        schema, smollm2_vocab, on_unsupported="check_after", cache=fresh_cache()
    )
    checked_after = {(use.keyword, use.pointer) for use in compiled.report.checked_after}
    enforced = {(use.keyword, use.pointer) for use in compiled.report.enforced}
    assert ("maxItems", "") in checked_after and ("maxItems", "") not in enforced
    assert compiled.matcher().accept_string("[1,2,3]")


def test_object_counts_past_the_member_state_limit_are_checked_after_when_asked(
    smollm2_vocab: Vocabulary,
) -> None:
    properties = {f"p{k}": {"type": "integer"} for k in range(1_600)}
    schema = {"type": "object", "properties": properties, "maxProperties": 800, "minProperties": 1}
    compiled = compile_schema(
        schema, smollm2_vocab, on_unsupported="check_after", cache=fresh_cache()
    )
    checked_after = {(use.keyword, use.pointer) for use in compiled.report.checked_after}
    enforced = {(use.keyword, use.pointer) for use in compiled.report.enforced}
    assert {("maxProperties", ""), ("minProperties", "")} <= checked_after
    assert not {("maxProperties", ""), ("minProperties", "")} & enforced
    matcher = compiled.matcher()
    assert matcher.accept_string('{"p0":1,"p7":2}') and matcher.can_end()
    assert compiled.check({}) != []  # minProperties, after the grammar let it through
    assert compiled.check({f"p{k}": 1 for k in range(801)}) != []


def test_the_time_budget_stops_a_slow_compile(smollm2_vocab: Vocabulary) -> None:
    # 2,000 anyOf branches take 0.18-0.24 s to compile on an AMD EPYC; a 0.05 s budget
    # stops them in the act (0.2 s no longer did there).
    schema = {
        "anyOf": [
            {"type": "object", "properties": {f"k{i}": {"const": i}}, "required": [f"k{i}"]}
            for i in range(2000)
        ]
    }
    started = time.perf_counter()
    with pytest.raises(SchemaError) as raised:
        compile_schema(
            schema, smollm2_vocab, cache=fresh_cache(), budget=CompileBudget(seconds=0.05)
        )
    assert raised.value.limit == "seconds" and "time budget of 0.05 s" in str(raised.value)
    assert time.perf_counter() - started < HANG_GUARD_SECONDS


def test_a_past_deadline_names_the_schema_object_it_stopped_at() -> None:
    passed = Deadline(time.monotonic() - 1, 0.5)
    with pytest.raises(SchemaError, match="while compiling the schema at /; ") as raised:
        schema_to_grammar({"type": "object"}, cache=fresh_cache(), deadline=passed)
    assert raised.value.limit == "seconds"


def test_a_schema_that_holds_itself_is_refused() -> None:
    # The nesting check refuses it, through dicts and through a tuple (an array to the cache
    # key's JSON dump, whose own cycle check raised a bare ValueError before).
    looped: dict[str, Any] = {"type": "object"}
    looped["properties"] = {"again": looped}
    with pytest.raises(SchemaError, match="nested deeper than"):
        schema_to_grammar(looped, cache=fresh_cache())
    through_tuple: dict[str, Any] = {"type": "object"}
    through_tuple["properties"] = {"a": {"enum": (through_tuple,)}}
    with pytest.raises(SchemaError, match="nested deeper than"):
        schema_to_grammar(through_tuple, cache=fresh_cache())


def test_tuples_nested_past_the_limit_are_refused_with_their_pointer() -> None:
    # A tuple is an array to the JSON dump of the cache key, which recursed 100,000 deep
    # (RecursionError) before the nesting check walked tuples.
    value: Any = 1
    for _ in range(100_000):
        value = (value,)
    with pytest.raises(SchemaError, match="nested deeper than") as raised:
        schema_to_grammar({"enum": [value]}, cache=fresh_cache())
    assert raised.value.pointer.startswith("/enum/0/0/0")


def test_the_grammar_compiler_applies_its_budget(smollm2_vocab: Vocabulary) -> None:
    compiler = GrammarCompiler(smollm2_vocab, disk_cache=False, budget=CompileBudget(nfa_states=50))
    with pytest.raises(CompileLimitError) as raised:
        compiler.compile_regex("[a-z]{100}")
    assert raised.value.limit == "nfa_states"
    assert compiler.compile_regex("[a-z]{100}", budget=CompileBudget()) is not None


def test_enum_values_are_filtered_by_the_schema_s_own_draft_formats(
    smollm2_vocab: Vocabulary,
) -> None:
    # Draft 2020-12's "time" needs an offset: 08:30:06Z is valid, 08:30:06 is not. A bare
    # FormatChecker() (draft 3's time) had it the other way round.
    schema = {"type": "string", "enum": ["08:30:06Z", "08:30:06"], "format": "time"}
    compiled = compile_schema(schema, smollm2_vocab, cache=fresh_cache())
    valid, invalid = compiled.matcher(), compiled.matcher()
    assert valid.accept_string('"08:30:06Z"') and valid.can_end()
    assert not (invalid.accept_string('"08:30:06"') and invalid.can_end())
    alone = compile_schema({**schema, "enum": ["08:30:06Z"]}, smollm2_vocab, cache=fresh_cache())
    assert alone.matcher().accept_string('"08:30:06Z"')


def test_a_lone_surrogate_is_written_as_its_escape(smollm2_vocab: Vocabulary) -> None:
    compiled = compile_schema({"enum": ["\ud800"]}, smollm2_vocab, cache=fresh_cache())
    matcher = compiled.matcher()
    assert matcher.accept_string('"\\ud800"') and matcher.can_end()
    assert compiled.check("\ud800") == []


def test_draft7_enum_beside_tuple_items_is_filtered_by_draft7(smollm2_vocab: Vocabulary) -> None:
    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "array",
        "items": [{"type": "integer"}],
        "additionalItems": False,
        "enum": [[1], [2, 3], ["x"]],
    }
    compiled = compile_schema(schema, smollm2_vocab, cache=fresh_cache())
    assert compiled.matcher().accept_string("[1]")
    for refused in ("[2,3]", '["x"]'):
        matcher = compiled.matcher()
        assert not (matcher.accept_string(refused) and matcher.can_end())


def test_twenty_nested_arrays_compile_to_a_small_grammar(smollm2_vocab: Vocabulary) -> None:
    compiled = compile_schema(nested("array", 20), smollm2_vocab, cache=fresh_cache())
    text = "[" * 20 + "1" + "]" * 20
    matcher = compiled.matcher()
    assert matcher.accept_string(text) and matcher.can_end()
    assert compiled.compiled_grammar.statistics.states < 2_000


def test_an_after_check_that_cannot_run_reports_it(smollm2_vocab: Vocabulary) -> None:
    compiled = compile_schema(
        {"$dynamicRef": "#meta"}, smollm2_vocab, on_unsupported="check_after", cache=fresh_cache()
    )
    errors = compiled.check(1)
    assert errors and "could not run" in errors[0]


def test_a_vocabulary_that_cannot_begin_the_output_is_refused() -> None:
    vocabulary = Vocabulary.from_list([b"<eos>", b"a", b"{", b"}"], eos_ids=[0])
    with pytest.raises(SchemaError, match="no token of this vocabulary can begin"):
        compile_schema({"type": "string"}, vocabulary, cache=fresh_cache())


def test_a_missing_vocabulary_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="expected a formline Vocabulary"):
        compile_schema({"type": "integer"}, None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="expected a formline Vocabulary"):
        compile_grammar(Grammar.from_regex("a"), None)  # type: ignore[arg-type]


def test_a_bitmask_of_the_wrong_shape_is_refused(smollm2_vocab: Vocabulary) -> None:
    compiled = compile_schema({"type": "integer"}, smollm2_vocab, cache=fresh_cache())
    matcher = compiled.matcher()
    words = allocate_token_bitmask(1, smollm2_vocab.size).shape[1]
    for wrong, fragment in (
        (np.zeros(3, dtype=np.int32), "this vocabulary needs"),
        (np.zeros((1, words), dtype=np.int64), "must be int32"),
        (np.zeros((1, 1, words), dtype=np.int32), "1 or 2 dimensions"),
    ):
        with pytest.raises(ValueError, match=fragment):
            matcher.fill_next_token_bitmask(wrong)
    with pytest.raises(ValueError, match="not one of the bitmask's 1 rows"):
        matcher.fill_next_token_bitmask(allocate_token_bitmask(1, smollm2_vocab.size), 3)
    wider = np.zeros((2, words + 5), dtype=np.int32)  # padded logits: wider rows are fine
    assert matcher.fill_next_token_bitmask(wider, 1) and wider[1, words:].sum() == 0


@pytest.mark.parametrize(
    ("schema", "fragment"),
    [
        (
            {"const": float("inf")},
            "inf is not a JSON number (a number past 1.8e308, or NaN) at /const",
        ),
        ({"enum": [1, float("nan")]}, "at /enum/1"),
        ({"type": "string", "pattern": "a{4294967296}"}, "a pattern Python cannot read"),
        ({"$ref": "#/x", "x": {"enum": 5}}, "enum must be an array"),  # the metaschema misses x
        ({"$ref": "#/x", "x": {"type": "array", "prefixItems": 5}}, "prefixItems must be"),
    ],
)
def test_a_malformed_value_is_a_schema_error_not_a_crash(schema: Any, fragment: str) -> None:
    # Each was an OverflowError, a TypeError, or (inf) a grammar that wrote "Infinity".
    with pytest.raises(SchemaError) as raised:
        schema_to_grammar(schema)
    assert fragment in str(raised.value)


def test_a_number_past_double_range_in_json_text_is_refused() -> None:
    with pytest.raises(SchemaError, match="not a JSON number"):
        schema_to_grammar(schema_of('{"const": 1e999}'))  # Python reads it as inf


def test_a_non_finite_annotation_is_allowed() -> None:
    # A Pydantic model's float("inf") default: the grammar never writes a default.
    model = {
        "type": "object",
        "properties": {
            "x": {"type": "number", "default": float("inf"), "examples": [float("nan")]},
            "default": {"type": "integer"},  # a property named default holds a schema
        },
    }
    grammar, _ = schema_to_grammar(model)
    assert build_pushdown(grammar).matches(b'{"x":1.5,"default":2}')
    named = {"type": "object", "properties": {"default": {"const": float("nan")}}}
    with pytest.raises(SchemaError, match="not a JSON number"):
        schema_to_grammar(named)
    with pytest.raises(SchemaError, match="at /properties/x/minimum"):
        schema_to_grammar({"properties": {"x": {"default": 1, "minimum": float("-inf")}}})


@pytest.mark.parametrize(
    "schema", [{"const": {"default": float("inf")}}, {"enum": [{"examples": [float("nan")]}, 1]}]
)
def test_a_non_finite_number_in_data_named_like_an_annotation(schema: Any) -> None:
    # Inside const and enum a key named default is data the grammar writes ("Infinity").
    with pytest.raises(SchemaError, match="not a JSON number"):
        schema_to_grammar(schema)


def test_the_time_budget_stops_a_long_rule_chain(smollm2_vocab: Vocabulary) -> None:
    # The IR's facts settle one rule of a chain per pass, and the passes never asked the
    # clock: 100,000 rules ran 58 s past a 5 s budget.
    rules = 100_000
    text = "root ::= r0\n" + "".join(f"r{k} ::= r{k + 1}\n" for k in range(rules))
    grammar = Grammar.from_gbnf(text + f'r{rules} ::= "x"\n')
    started = time.perf_counter()
    with pytest.raises(CompileLimitError, match="time budget of 1 s"):
        compile_grammar(
            grammar, smollm2_vocab, cache=fresh_cache(), budget=CompileBudget(seconds=1)
        )
    assert time.perf_counter() - started < HANG_GUARD_SECONDS
