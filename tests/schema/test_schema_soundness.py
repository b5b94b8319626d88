"""Soundness of the schema compiler as a property (issue 15), over a few hundred schemas.

Valid instances (drawn by hypothesis-jsonschema, shipped with the data, or mutations that
stayed valid) must be accepted along their canonical tokenization up to EOS; invalid ones
(mutations the oracle refuses) must be refused where the report says a keyword they violate is
enforced. The machinery, the counts and the known bugs are in ``soundness.py``; ``pytest -s``
prints the figures, and ``PYTHONPATH=src python3 tests/schema/soundness.py`` runs it alone.

A bug it finds gets a minimal strict-xfail test here and an entry in ``soundness.KNOWN_BUGS``
until it is fixed; then the repro stays as a regression test (``FIXED_REPROS``: the four it
found first are fixed).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from soundness import (
    EXAMPLES,
    KNOWN_BUGS,
    VALID_REFUSED,
    Case,
    Checker,
    Classifier,
    Counterexample,
    Tally,
    Walk,
    ecma_regex,
    exact_is_valid,
    oracle,
    run_all,
    walk,
)
from soundness_examples import load_store

from formline.schema import compile_schema


@pytest.fixture(scope="module")
def tally(smollm2_vocab: Any, smollm2_tokenizer: Any) -> Tally:
    result = run_all(smollm2_vocab, smollm2_tokenizer)
    print("\n" + result.summary())
    if result.known:
        print(f"known bugs met: {sorted({failure.known for failure in result.known})}")
    return result


def test_valid_instances_accepted_and_invalid_ones_refused_where_enforced(tally: Tally) -> None:
    assert not tally.failures, (
        f"{len(tally.failures)} counterexamples (reduce each to a minimal schema + instance):\n"
        + tally.failure_text()
    )


def test_the_run_covers_what_it_claims(tally: Tally) -> None:
    counts = tally.counts
    sources = ("extraction-dev", "maskbench", "generated")
    assert counts["schemas tried"] == sum(counts[f"schemas tried ({s})"] for s in sources)
    assert counts["schemas compiled"] >= 200, tally.summary()
    assert all(counts[f"schemas compiled ({s})"] for s in sources), tally.summary()
    # The examples come from the store, so these counts are the same on every machine.
    assert counts["schemas drawn live"] == 0, (
        f"{counts['schemas drawn live']} schemas are not in tests/data/soundness/examples.json:"
        " store them with PYTHONPATH=src python3 tests/schema/soundness.py --store-examples"
    )
    assert counts["valid tried"] >= 1800 and counts["valid generated"] >= 900, tally.summary()
    assert counts["invalid enforced"] >= 3500, tally.summary()
    # Every schema that yields nothing is counted with its reason, never dropped silently.
    skipped = counts["schemas not compiled"] + counts["schemas without instances"]
    assert skipped == sum(counts[f"schemas skipped ({s})"] for s in sources)
    assert skipped <= 0.1 * counts["schemas tried"], tally.summary()


def test_a_schema_the_store_lacks_is_drawn_live_and_counted(
    smollm2_vocab: Any, smollm2_tokenizer: Any
) -> None:
    fresh = Case("generated", "fresh", {"type": "string", "maxLength": 3, "x-unstored": 1})
    checker = Checker(smollm2_vocab, smollm2_tokenizer)
    examples, reason = checker.examples(fresh)
    assert checker.tally.counts["schemas drawn live"] == 1 and reason is None
    assert examples and all(isinstance(e, str) and len(e) <= 3 for e in examples)
    kept = load_store().lookup(load_store().generated_schemas[1], EXAMPLES["generated"])
    assert kept is not None and kept.examples
    assert checker.examples(Case("generated", "kept", load_store().generated_schemas[1]))[0] == (
        kept.examples
    )
    assert checker.tally.counts["schemas drawn live"] == 1


# --- the oracle and the classifier ----------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "text", "matches"),
    [
        (r"^\d+$", "123", True),
        (r"^\d+$", "١٢٣", False),  # ECMA-262 \d is ASCII; Python's re takes Arabic-Indic digits
        (r"^\d+$", "12\n", False),  # ECMA-262 $ is the very end; Python's also before a final \n
        (r"^\w$", "é", False),
        (r"^\s$", "\u00a0", True),
        (r"^\s$", "\x1c", False),  # Python's \s has the information separators, ECMA's not
        (r"^[^\s\d]+$", "ab", True),
        (r"^[^\s\d]+$", "a1", False),
        (r"^a.b$", "a\u2028b", False),
        (r"[^]", "x", True),
        (r"^(?<x>a)$", "a", True),
    ],
)
def test_the_oracle_reads_patterns_as_ecma_262(pattern: str, text: str, matches: bool) -> None:
    assert (ecma_regex(pattern).search(text) is not None) is matches


def test_the_oracle_applies_formline_documented_format_narrowings() -> None:
    validator = oracle({"type": "string", "format": "email"})
    assert validator.is_valid("a.b@example.com") and not validator.is_valid("a@@b")
    assert not oracle({"format": "date-time"}).is_valid("2024-01-01T00:00:00Z\n")
    assert oracle({"format": "uuid"}).is_valid("12345678-1234-1234-1234-123456789abc")
    assert not oracle({"format": "uuid"}).is_valid("{12345678-1234-1234-1234-123456789abc}")


def test_exact_decimals_settle_float_rounding() -> None:
    schema = {"type": "integer", "maximum": 3.6893488147419103e19}  # the float is 2**65
    assert oracle(schema).is_valid(2**65 - 1)  # jsonschema compares with the float
    assert not exact_is_valid(schema, 2**65 - 1)  # the bound's JSON text is 36893488147419103000
    assert exact_is_valid({"type": "integer"}, 1.0) and exact_is_valid({"minimum": 0.1}, 0.1)


def test_the_classifier_follows_merges_branches_and_checked_after_parents(
    smollm2_vocab: Any,
) -> None:
    from formline.schema import compile_schema

    def classify(schema: Any, instance: Any) -> str:
        compiled = compile_schema(schema, smollm2_vocab, disk_cache=False)
        return Classifier(schema, compiled.report, oracle(schema)).classify(instance)[0]

    merged = {"allOf": [{"enum": [[1, 2]]}, {"type": "array"}]}
    assert classify(merged, [2, 1]) == "enforced"
    spread = {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "oneOf": [{"required": ["a"]}, {"required": ["b"]}],
    }
    assert classify(spread, {"a": "x"}) == "enforced"
    patterned = {"type": "object", "patternProperties": {"^a": {"type": "integer"}}}
    assert classify(patterned, {"ab": "x"}) == "checked after"  # may take the extra-key branch
    named = {"allOf": [{"properties": {"b": {"enum": [1]}}}, {"propertyNames": {"maxLength": 3}}]}
    assert classify(named, {"b": 2}) == "checked after"  # an extra key may repeat "b"
    assert classify({"type": "integer", "multipleOf": 3}, 4) == "checked after"
    referenced = {"$defs": {"n": {"type": "integer"}}, "items": {"$ref": "#/$defs/n"}}
    assert classify(referenced, ["x"]) == "enforced"


# --- known bugs: one minimal repro each -----------------------------------------------------


def walk_instance(vocabulary: Any, tokenizer: Any, schema: Any, instance: Any) -> Walk:
    """The property test's walk of one instance (canonical text, canonical tokens, EOS)."""
    checker = Checker(vocabulary, tokenizer)
    compiled = checker.compile(schema)
    prepared = checker.text_and_pieces(compiled, instance)
    assert prepared is not None
    return walk(compiled, prepared[1], checker.token_bytes, checker.eos)


FIXED_REPROS = [
    pytest.param(
        {"enum": [1e20]},
        10**20,
        "enum/const: integral float of 1e16 or more",
        id="enum-1e20-as-integer",
    ),
    pytest.param(
        {"const": [1.0, {"a": 2.0}]},
        [1, {"a": 2}],
        "enum/const: numbers inside arrays and objects",
        id="const-nested-integral-float",
    ),
    pytest.param(
        {"type": "integer"},
        1e16,
        "type integer: integral float of 1e16 or more",
        id="integer-1e16",
    ),
]


@pytest.mark.parametrize(("schema", "instance", "bug"), FIXED_REPROS)
def test_a_fixed_bug_stays_fixed(
    smollm2_vocab: Any, smollm2_tokenizer: Any, schema: Any, instance: Any, bug: str
) -> None:
    assert exact_is_valid(schema, instance)
    result = walk_instance(smollm2_vocab, smollm2_tokenizer, schema, instance)
    assert result.accepted, f"{json.dumps(schema)} refuses {json.dumps(instance)}: {result.detail}"


def test_a_format_outside_its_draft_is_enforced_and_reported(smollm2_vocab: Any) -> None:
    schema = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "string"}
    compiled = compile_schema({**schema, "format": "date"}, smollm2_vocab, disk_cache=False)
    assert any(use.note == "date (as in 2020-12)" for use in compiled.report.enforced)
    refused = compiled.matcher()
    assert not (refused.accept_string('"not-a-date"') and refused.can_end())


def test_the_format_case_matches_only_a_refusal_in_the_formatted_value(
    smollm2_vocab: Any, smollm2_tokenizer: Any
) -> None:
    schema = {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "type": "object",
        "properties": {"day": {"type": "string", "format": "date"}, "note": {"type": "string"}},
    }
    instance = {"note": "a", "day": "not-a-date"}  # valid in draft 4: no date format there
    assert exact_is_valid(schema, instance)
    checker = Checker(smollm2_vocab, smollm2_tokenizer)
    compiled = checker.compile(schema)
    prepared = checker.text_and_pieces(compiled, instance)
    assert prepared is not None
    text, pieces = prepared
    refused = walk(compiled, pieces, checker.token_bytes, checker.eos)
    assert not refused.accepted
    failure = Counterexample(VALID_REFUSED, "generated", "day", schema, instance, text, refused)
    name, matches = KNOWN_BUGS[0]
    assert "format" in name and matches(failure, checker), (refused, text)
    # A refusal the format does not cause (it stays under the schema without the format,
    # here a required "x" the instance lacks) is not this case: the property test fails on it.
    wrong = dataclasses.replace(failure, schema={**schema, "required": ["x"]})
    assert not matches(wrong, checker)
