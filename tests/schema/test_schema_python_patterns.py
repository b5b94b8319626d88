"""ECMA-262 patterns as Python ``re`` patterns: Python's ``re.search`` on the rewritten pattern
agrees with the grammar's own reading of the pattern (the pushdown automaton of
:func:`~formline.schema.patterns.pattern_node`), and every check that runs Python's ``re``
(the after-check, the meta-schema's ``regex`` format, the compiler's name and enum filters,
the evaluation's validity) reads a pattern as the grammar does."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_schema_patterns import (
    REAL_WORLD_PATTERNS,
    SETTINGS,
    SUITE_CASES,
    TRANSLATED,
    matcher_for,
    texts_for,
    to_python,
)

from formline.evaluation.runner import is_valid
from formline.grammar.ir import GrammarError
from formline.schema import SchemaError, compile_schema
from formline.schema.api import SchemaCheck, serialize_like_schema
from formline.schema.metaschema import check_schema
from formline.schema.python_patterns import is_ecma_regex, python_pattern, with_python_patterns
from formline.vocab import Vocabulary

# (pattern, text, ECMA-262's verdict): each is one Python's re reads the other way.
DISAGREEMENTS = [
    (r"^\W+$", "é", True),  # Python's \w is Unicode
    (r"^\w+$", "é", False),
    (r"^\d$", "٣", False),  # so is its \d (ARABIC-INDIC DIGIT THREE)
    (r"^\D$", "٣", True),
    (r"^\s$", "\ufeff", True),  # ECMA-262's \s has U+FEFF, Python's has not
    (r"^\s$", "\x1c", False),  # Python's \s has U+001C..U+001F, ECMA-262's has not
    (r"^\S$", "\ufeff", False),
    (r"^a{,3}$", "a{,3}", True),  # a literal brace in ECMA-262 (Annex B)
    (r"^a{,3}$", "aa", False),  # {0,3} in Python
    (r"^abc$", "abc\n", False),  # Python's $ also matches before a final newline
    (r"^.$", "\u2028", False),  # a line terminator in ECMA-262
    (r"^.$", "\r", False),
]
# Patterns Python's re cannot read at all, with a string each matches and one it does not.
ECMA_ONLY = [
    (r"^\p{Lu}+$", "ÀB", "Àb"),
    (r"^\p{Letter}cole$", "école", "1cole"),
    (r"^\cJ$", "\n", "J"),
    (r"^[^]$", "\n", ""),
    (r"^\u{1F600}$", "😀", "x"),
]


@pytest.mark.parametrize("pattern, text, verdict", DISAGREEMENTS)
def test_python_form_reads_as_ecma(pattern: str, text: str, verdict: bool) -> None:
    assert (re.search(pattern, text) is not None) != verdict  # Python's own reading differs
    assert (re.search(python_pattern(pattern), text) is not None) == verdict
    assert matcher_for(pattern)(text) == verdict  # and the grammar's reading is ECMA-262's


@pytest.mark.parametrize("pattern, match, miss", ECMA_ONLY)
def test_patterns_python_cannot_read(pattern: str, match: str, miss: str) -> None:
    with pytest.raises(re.error):
        re.compile(pattern)
    assert re.search(python_pattern(pattern), match)
    assert not re.search(python_pattern(pattern), miss)
    assert is_ecma_regex(pattern)


def test_official_suite_pattern_cases_agree() -> None:
    assert len(SUITE_CASES) > 50
    for pattern, text, valid in SUITE_CASES:
        assert (re.search(python_pattern(pattern), text) is not None) == valid, (pattern, text)


@pytest.mark.parametrize("pattern", REAL_WORLD_PATTERNS + list(TRANSLATED))
def test_python_form_agrees_with_the_grammar(pattern: str) -> None:
    compiled = re.compile(python_pattern(pattern))
    matches = matcher_for(pattern)

    @SETTINGS
    @given(texts_for(to_python(pattern)))
    def check(text: str) -> None:
        assert (compiled.search(text) is not None) == matches(text), (pattern, text)

    check()


# Small patterns built from the pieces where the dialects part: classes and their
# negations, dots, braces, anchors, alternation and repeats.
PIECES = [r"\w", r"\W", r"\d", r"\D", r"\s", r"\S", ".", "a", "é", r"[a-c]", r"[^a]", r"\u00e9"]
PATTERNS = st.builds(
    lambda start, pieces, quantifier, end, other: (
        ("^" if start else "")
        + "".join(pieces)
        + quantifier
        + ("$" if end else "")
        + (f"|{other}" if other else "")
    ),
    st.booleans(),
    st.lists(st.sampled_from(PIECES), min_size=1, max_size=3),
    st.sampled_from(["", "*", "+", "?", "{2}", "{,2}", "{1,}", "{0,2}"]),
    st.booleans(),
    st.sampled_from(["", "b", r"\s$", "^x"]),
)
TEXTS = st.text(st.sampled_from(["a", "b", "x", "é", "٣", " ", "\ufeff", "\n", "\u2028", "{", ",",
                                 "2", "}", "_", "\x1c"]), max_size=6)  # fmt: skip


@SETTINGS
@given(PATTERNS, TEXTS)
def test_drawn_patterns_agree_with_the_grammar(pattern: str, text: str) -> None:
    assert (re.search(python_pattern(pattern), text) is not None) == matcher_for(pattern)(text)


def test_unreadable_pattern_raises() -> None:
    with pytest.raises(GrammarError, match="lookahead"):
        python_pattern("a(?=b)")


def test_schema_rewrite_walks_schemas_only() -> None:
    schema = {
        "properties": {"a": {"pattern": r"^\w$"}, "pattern": {"const": {"pattern": r"\d"}}},
        "patternProperties": {r"^\d$": {"items": [{"pattern": "x"}]}},
        "$defs": {"b": {"anyOf": [{"pattern": "$"}]}},
        "enum": [{"pattern": r"\s"}],
    }
    rewritten, originals = with_python_patterns(schema)
    assert rewritten["properties"]["a"]["pattern"] == python_pattern(r"^\w$")
    assert rewritten["properties"]["pattern"] == {"const": {"pattern": r"\d"}}  # data
    assert rewritten["enum"] == [{"pattern": r"\s"}]
    assert list(rewritten["patternProperties"]) == [python_pattern(r"^\d$")]
    only = rewritten["patternProperties"][python_pattern(r"^\d$")]
    assert only == {"items": [{"pattern": python_pattern("x")}]}
    assert rewritten["$defs"]["b"]["anyOf"][0]["pattern"] == python_pattern("$")
    assert originals[python_pattern(r"^\w$")] == r"^\w$"
    assert schema["properties"]["a"]["pattern"] == r"^\w$"  # the input is not changed


def test_two_spellings_of_one_language_stay_two_patterns() -> None:
    both = {"patternProperties": {"^[0-9]+$": {"type": "integer"}, "^\\d+$": {"minimum": 5}}}
    rewritten, originals = with_python_patterns(both)
    assert len(rewritten["patternProperties"]) == 2  # one key dropped the integer type
    assert sorted(originals.values()) == ["^[0-9]+$", "^\\d+$"]
    check = SchemaCheck(both)
    assert check.check({"12": "x"}) != [] and check.check({"12": 3}) != []
    assert check.check({"12": 7}) == []
    names = {"properties": {"a": {"pattern": "^[0-9]$"}, "b": {"pattern": "^\\d$"}}}
    assert SchemaCheck(names).check({"a": "x", "b": "y"}) == [
        "'x' does not match '^[0-9]$' (at /a)",
        "'y' does not match '^\\\\d$' (at /b)",
    ]


def test_references_meet_rewritten_patterns() -> None:
    # A $ref through a renamed patternProperties name is renamed with it.
    through = {
        "patternProperties": {"^a": {"type": "integer"}},
        "properties": {"b": {"$ref": "#/patternProperties/^a"}},
    }
    assert SchemaCheck(through).check({"b": 1}) == []
    assert SchemaCheck(through).check({"b": "x"}) != []
    # So is one inside a resource of its own ($id): its "#/" starts there.
    resource = {
        "$id": "https://example.com/root.json",
        "$defs": {"r": {"$id": "https://example.com/r.json", **through}},
        "$ref": "https://example.com/r.json",
    }
    assert SchemaCheck(resource).check({"b": 1}) == []
    # A schema a $ref reaches outside the keywords is rewritten too.
    elsewhere = {"$ref": "#/components/mark", "components": {"mark": {"pattern": r"^\W$"}}}
    assert SchemaCheck(elsewhere).check("é") == []
    assert SchemaCheck(elsewhere).check("e") != []


def test_serialize_picks_the_branch_by_ecma_patterns() -> None:
    ordered = {"type": "object", "properties": {"s": {"pattern": r"^\W$"}, "x": {}, "y": {}}}
    schema = {
        "anyOf": [
            {**ordered, "required": ["s", "x", "y"]},
            {"type": "object", "properties": {"y": {}, "x": {}, "s": {}}},
        ]
    }
    assert serialize_like_schema(schema, {"y": 1, "x": 2, "s": "é"}) == '{"s":"é","x":2,"y":1}'
    assert serialize_like_schema(schema, {"y": 1, "x": 2, "s": "e"}) == '{"y":1,"x":2,"s":"e"}'


def test_pathological_patterns_end_in_bounded_time() -> None:
    with pytest.raises(GrammarError, match="Python form would pass"):
        python_pattern("^" + r"\p{L}" * 400 + "$")  # 4.9 MB of ranges: not made
    # Chained quantifiers are "nothing to repeat" in ECMA-262 (they were read, and 2,000 of
    # them chained too deeply): refused at the second, with no RecursionError.
    with pytest.raises(GrammarError, match="multiple repeat"):
        python_pattern("a" + "{1}" * 2000)
    with pytest.raises(SchemaError, match="regex"):
        check_schema({"type": "string", "pattern": "a" + "{1}" * 2000})
    # Left in its ECMA form, it is run by the regex module, which reads \p{L} as ECMA does.
    findings = SchemaCheck({"pattern": "^" + r"\p{L}" * 400 + "$"}).check("a")
    assert len(findings) == 1 and "does not match" in findings[0]


def test_after_check_reads_patterns_as_the_grammar(smollm2_vocab: Vocabulary) -> None:
    schema = {"type": "object", "properties": {"mark": {"type": "string", "pattern": r"^\W$"}}}
    compiled = compile_schema(schema, smollm2_vocab, disk_cache=False)
    text = '{"mark":"é"}'
    matcher = compiled.matcher()
    assert matcher.accept_string(text.encode()) and matcher.can_end()  # the grammar writes it
    assert compiled.check(json.loads(text)) == []  # and its after-check passes it
    findings = compiled.check({"mark": "ab"})
    assert findings == ["'ab' does not match '^\\\\W$' (at /mark)"]  # the pattern as written


def test_after_check_of_a_pattern_python_cannot_read() -> None:
    check = SchemaCheck({"type": "string", "pattern": r"^\p{Lu}$"})
    assert check.check("Á") == []  # re.error escaped the check before
    assert len(check.check("á")) == 1
    assert is_valid({"pattern": r"^\p{Lu}$"}, "Á") and not is_valid({"pattern": r"^\W$"}, "a")


def test_after_check_names_a_pattern_neither_can_read() -> None:
    findings = SchemaCheck({"pattern": "(?<=a"}).check("b")
    assert len(findings) == 1 and findings[0].startswith("the after-check could not run")


def test_meta_schema_regex_format_is_ecma() -> None:
    check_schema({"pattern": r"^\p{Letter}+$", "patternProperties": {r"\cC": {}}})
    with pytest.raises(SchemaError, match="regex"):
        check_schema({"pattern": "(unclosed"})


def test_declared_names_meet_pattern_properties_as_ecma(smollm2_vocab: Vocabulary) -> None:
    # "é" is not matched by ^\w+$ in ECMA-262: it is only a string, not a string and an
    # integer (Python's re matched it, and the grammar refused every value of "é").
    schema = {
        "type": "object",
        "properties": {"é": {"type": "string"}},
        "patternProperties": {r"^\w+$": {"type": "integer"}},
        "required": ["é"],
    }
    compiled = compile_schema(schema, smollm2_vocab, disk_cache=False)
    matcher = compiled.matcher()
    assert matcher.accept_string('{"é":"x"}'.encode()) and matcher.can_end()
    assert compiled.check({"é": "x"}) == []
    closed = {"type": "object", "patternProperties": {r"^\d$": {}}, "additionalProperties": False}
    findings = SchemaCheck(closed).check({"x": 1})  # names the pattern as written
    assert findings == ["'x' does not match any of the regexes: '^\\\\d$' (at /)"]


def test_enum_filtered_by_an_ecma_pattern(smollm2_vocab: Vocabulary) -> None:
    schema = {"enum": ["é", "a", "٣"], "pattern": r"^\W$"}
    compiled = compile_schema(schema, smollm2_vocab, disk_cache=False)
    for value, allowed in (("é", True), ("٣", True), ("a", False)):
        matcher = compiled.matcher()
        text = json.dumps(value, ensure_ascii=False).encode()
        assert (matcher.accept_string(text) and matcher.can_end()) == allowed, value
        assert (compiled.check(value) == []) == allowed, value


def test_property_names_filtered_by_an_ecma_pattern(smollm2_vocab: Vocabulary) -> None:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {"é": {"type": "integer"}, "b": {"type": "integer"}},
        "propertyNames": {"pattern": r"^\W$"},
        "additionalProperties": False,
    }
    compiled = compile_schema(schema, smollm2_vocab, disk_cache=False)
    for text, allowed in (('{"é":1}', True), ('{"b":1}', False)):
        matcher = compiled.matcher()
        assert (matcher.accept_string(text.encode()) and matcher.can_end()) == allowed, text
        assert (compiled.check(json.loads(text)) == []) == allowed, text
