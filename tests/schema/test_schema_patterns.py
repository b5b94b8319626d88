"""JSON Schema patterns as IR of JSON string bodies: the node accepts the body iff ECMA matches.

Every node is compiled with the real pushdown builder and fed the canonical body
``json.dumps(s, ensure_ascii=False)[1:-1]``. The reference is Python's ``re.search`` on a
translation of the ECMA pattern (``$`` -> ``\\Z``; ``.``, ``\\s`` and the ASCII ``\\d``/``\\w``
of ECMA-262 spelled out; named groups), plus the official test suite's pattern cases.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable
from functools import cache

import pytest
from conformance_suite import SUITE as OFFICIAL_SUITE
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from formline.grammar.ir import Grammar, GrammarError, Node, walk
from formline.parser.pushdown import build_pushdown
from formline.schema.patterns import (
    ECMA_SPACE,
    json_string_character,
    length_node,
    pattern_node,
    unicode_property_ranges,
)

SUITE = OFFICIAL_SUITE / "draft2020-12"
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ECMA_SPACE_CLASS = "".join(
    f"\\u{low:04x}" if low == high else f"\\u{low:04x}-\\u{high:04x}" for low, high in ECMA_SPACE
)
CHARACTERS = st.characters(codec="utf-8")  # no lone surrogates: JSON text cannot carry them
CLASS_ESCAPES = {"s": ECMA_SPACE_CLASS, "d": "0-9", "w": "A-Za-z0-9_"}
# fmt: off
SPECIAL_CHARACTERS = ['"', "\\", "/", "\x00", "\x1f", "\b", "\f", "\n", "\r", "\t", "\x7f",
                      "\u2028", "\u00a0", "é", "中", "😀", "{", "}", "$", "^", "-", ".", " "]
REAL_WORLD_PATTERNS = [
    r"^[a-z0-9-]+$", r"^\d{3}-\d{4}$", r"^(\([0-9]{3}\))?[0-9]{3}-[0-9]{4}$", r"^[A-Z]{2}$",
    "abc", r"^https?://", r"\.json$", r"^[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}$",
    r"^#?([a-fA-F0-9]{6}|[a-fA-F0-9]{3})$", r"^\d{5}(-\d{4})?$", r"^[A-Z][a-z]+( [A-Z][a-z]+)*$",
    r"^v?\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$", r"^[^\s@]+@[^\s@]+$", r"^\S+$", r"^\w+$",
    r"^[\w.-]+$", r"^(?:\+?1[-. ]?)?\(?\d{3}\)?[-. ]?\d{3}[-. ]?\d{4}$",
    r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$", r"^(foo|bar|baz)$", r"^foo|bar$",
    r"^$", r"^.{1,10}$", r"a.c", r'^[^"\\]*$', '"', r"\\", r"^[\x00-\x1f]+$", r"^\t\n$",
    r"[\u00e0-\u00ff]", r"^[^a-z]*$", "x*", r"^(ab)+$", r"^a{2,3}b?$",
    r"^[-+]?[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?$", r"^/[a-z/]*$", r"^\/api\/v[0-9]+\/",
    r"^[A-Z]{3}-\d{3,}$", r"^(?<area>\d{3})-(?<number>\d{4})$", r"^\s*$", r"^[[\]]+$",
    r"^(a|b)*a(a|b){3}$", r"^\{[a-z]+\}$", r"^[😀-😂]+$", r"^\u00e9\x41\cJ$", r"a$|^b",
    r"^\D\W$", r"^[^]$", r"^(?:ab?)*?\d??$", r"^\u{1F600}$",
]
# fmt: on
# ECMA-only syntax, with the equivalent Python pattern.
TRANSLATED = {r"^a{,2}$": r"^a\{,2\}\Z", r"^a{x}|{$": r"^a\{x\}|\{\Z"}


@cache
def body_matcher(node: Node) -> Callable[[str], bool]:
    """Whether the node accepts the whole canonical JSON body of a string."""
    automaton = build_pushdown(Grammar({"root": node}))
    stacks, accepts_empty = automaton.initial()

    def matches(text: str) -> bool:
        data = json.dumps(text, ensure_ascii=False).encode()[1:-1]
        if not data:
            return accepts_empty
        result = automaton.advance(stacks, data)
        return result is not None and result[1]

    return matches


def matcher_for(pattern: str) -> Callable[[str], bool]:
    return body_matcher(pattern_node(pattern))


def to_python(pattern: str) -> str:
    """The Python ``re`` pattern with the ECMA-262 meaning (for the supported subset)."""
    if pattern in TRANSLATED:
        return TRANSLATED[pattern]
    out: list[str] = []
    in_class = False
    index = 0
    while index < len(pattern):
        character = pattern[index]
        if character == "\\":
            escaped = pattern[index + 1]
            index += 2
            if escaped in CLASS_ESCAPES:
                members = CLASS_ESCAPES[escaped]
                out.append(members if in_class else f"[{members}]")
            elif escaped.lower() in CLASS_ESCAPES:
                assert not in_class
                out.append(f"[^{CLASS_ESCAPES[escaped.lower()]}]")
            elif escaped == "c":
                out.append(f"\\x{ord(pattern[index]) % 32:02x}")
                index += 1
            elif escaped == "u" and pattern[index] == "{":
                closing = pattern.index("}", index)
                out.append(f"\\U{int(pattern[index + 1 : closing], 16):08x}")
                index = closing + 1
            else:
                out.append("\\" + escaped)
            continue
        index += 1
        if in_class:
            in_class = character != "]"
            out.append("\\[" if character == "[" else character)  # no nested-set warning
        elif character == "[":
            in_class = True
            if pattern.startswith("^]", index):  # [^] is any character
                out.append(r"[\s\S]")
                index += 2
                in_class = False
            else:
                out.append(character)
        elif character == "$":
            out.append(r"\Z")
        elif character == ".":
            out.append("[^\\n\\r\\u2028\\u2029]")
        elif character == "<" and out[-1:] == ["?"] and out[-2:-1] == ["("]:
            out.append("P<")
        else:
            out.append(character)
    return "".join(out)


def texts_for(python_pattern: str) -> st.SearchStrategy[str]:
    """Matches, near misses (one edit of a match) and arbitrary text with JSON specials."""
    positives = st.from_regex(python_pattern)
    alphabet = st.one_of(st.sampled_from(SPECIAL_CHARACTERS), st.characters(max_codepoint=0x7F))
    noise = st.text(alphabet, max_size=12)

    def edit(text: str, position: int, inserted: str, delete: bool) -> str:
        position = position % (len(text) + 1)
        return text[:position] + inserted + text[position + (1 if delete else 0) :]

    near_misses = st.builds(edit, positives, st.integers(0, 50), alphabet, st.booleans())
    return st.one_of(positives, near_misses, noise, CHARACTERS)


@pytest.mark.parametrize("pattern", REAL_WORLD_PATTERNS + list(TRANSLATED))
def test_pattern_node_agrees_with_python_re(pattern: str) -> None:
    python_pattern = to_python(pattern)
    matches = matcher_for(pattern)
    compiled = re.compile(python_pattern)

    @SETTINGS
    @given(texts_for(python_pattern))
    def check(text: str) -> None:
        assert matches(text) == (compiled.search(text) is not None), (pattern, text)

    check()


def suite_cases(name: str) -> list[tuple[str, str, bool]]:
    """(pattern, string, valid) from a suite file, for string data and string keys."""
    cases = []
    for group in json.loads((SUITE / name).read_text()):
        schema = group["schema"]
        for test in group["tests"]:
            data = test["data"]
            if "pattern" in schema and isinstance(data, str):
                cases.append((schema["pattern"], data, test["valid"]))
            for pattern in schema.get("patternProperties", {}):
                if isinstance(data, dict) and len(data) == 1:
                    cases.append((pattern, next(iter(data)), test["valid"]))
    return cases


SUITE_CASES = suite_cases("pattern.json") + suite_cases("optional/ecmascript-regex.json")


def test_official_suite_pattern_cases() -> None:
    assert len(SUITE_CASES) > 50
    unsupported: dict[str, str] = {}
    for pattern, text, valid in SUITE_CASES:
        try:
            matches = matcher_for(pattern)
        except GrammarError as error:
            unsupported[pattern] = str(error)
            continue
        assert matches(text) == valid, (pattern, text, valid)
    assert unsupported == {}  # every pattern of the 2020-12 suite is supported


@pytest.mark.parametrize(
    ("name", "prefix"),
    [("L", "L"), ("Letter", "L"), ("Lu", "Lu"), ("Ll", "Ll"), ("N", "N"), ("Nd", "Nd")]
    + [("digit", "Nd"), ("P", "P"), ("punct", "P"), ("S", "S"), ("Z", "Z")]
    + [("Uppercase_Letter", "Lu"), ("gc=Sc", "Sc"), ("General_Category=Separator", "Z")],
)
def test_unicode_properties_follow_unicodedata(name: str, prefix: str) -> None:
    positive = matcher_for(f"^\\p{{{name}}}$")
    negative = matcher_for(f"^\\P{{{name}}}$")
    in_class = matcher_for(f"^[x\\p{{{name}}}]$")

    @SETTINGS
    @given(CHARACTERS)
    def check(character: str) -> None:
        expected = unicodedata.category(character).startswith(prefix)
        assert positive(character) == expected, (name, character)
        assert negative(character) == (not expected), (name, character)
        assert in_class(character) == (expected or character == "x")

    check()


def test_unicode_property_names() -> None:
    assert unicode_property_ranges("Letter") == unicode_property_ranges("l")
    assert unicode_property_ranges("decimal number") == unicode_property_ranges("Nd")
    assert unicode_property_ranges("ASCII") == [(0, 0x7F)]
    assert unicode_property_ranges("Script=Greek") is None
    assert unicode_property_ranges("Any", general_category_only=True) is None


@pytest.mark.parametrize(
    ("pattern", "position", "fragment"),
    [
        ("a(?=b)", 1, "lookahead"),
        ("a(?!b)", 1, "lookahead"),
        ("(?<=a)b", 0, "lookbehind"),
        ("(?<!a)b", 0, "lookbehind"),
        (r"(a)\1", 3, "backreference"),
        (r"(?<x>a)\k<x>", 7, "backreference"),
        (r"\bword", 0, "word boundary"),
        (r"a\B", 1, "word boundary"),
        ("a^b", 1, "'^'"),
        ("(^a)", 1, "'^'"),
        ("a$b", 1, "'$'"),
        ("(a$)", 2, "'$'"),
        (r"\p{Script=Greek}", 0, "Unicode property"),
        (r"\p{Emoji}", 0, "Unicode property"),
        (r"[\p{Nope}]", 1, "Unicode property"),
        (r"\01", 0, "octal"),
        (r"\c1", 0, r"\c"),
        (r"\u{110000}", 0, "bad escape"),
        (r"\uZZZZ", 0, "bad escape"),
        ("(?i)a", 0, "unsupported group"),
        ("(?P<x>a)", 0, "unsupported group"),
        ("[b-a]", 0, "bad character range"),
        ("(ab", 0, "unterminated group"),
        ("*a", 0, "nothing to repeat"),
    ],
)
def test_unsupported_or_malformed_patterns_raise_with_position(
    pattern: str, position: int, fragment: str
) -> None:
    with pytest.raises(GrammarError) as caught:
        pattern_node(pattern)
    assert caught.value.position == position, str(caught.value)
    assert fragment in str(caught.value)


def test_character_encoding_is_canonical_only() -> None:
    every = body_matcher(json_string_character([(0, 0x10FFFF)]))
    for code in [*range(0x80), 0xE9, 0x2028, 0xFFFF, 0x1F600, 0x10FFFF]:
        assert every(chr(code)), hex(code)
    automaton = build_pushdown(Grammar({"root": json_string_character([(0, 0x10FFFF)])}))
    stacks = automaton.initial()[0]
    for other in [b"\\/", b"\\u0041", b"\\u000A", b"\\u000a", b"\\u001F", b"\\x41", b"\\a"]:
        result = automaton.advance(stacks, other)
        assert result is None or not result[1], other
    for control in range(0x20):
        assert automaton.advance(stacks, bytes([control])) is None  # never raw
    assert automaton.advance(stacks, b'"') is None
    assert automaton.advance(stacks, b"\\") is not None  # the start of an escape


@SETTINGS
@given(
    st.lists(st.tuples(st.integers(0, 0x2FF), st.integers(0, 40)), min_size=1, max_size=4),
    st.text(CHARACTERS),
)
def test_json_string_character_matches_its_set(bounds: list[tuple[int, int]], text: str) -> None:
    ranges = [(low, min(low + width, 0x10FFFF)) for low, width in bounds]
    matches = body_matcher(json_string_character(ranges))
    for character in [*text[:4], *SPECIAL_CHARACTERS[:10]]:
        expected = any(low <= ord(character) <= high for low, high in ranges)
        assert matches(character) == expected, (ranges, character)


@SETTINGS
@given(st.integers(0, 4), st.one_of(st.none(), st.integers(0, 4)), st.text(CHARACTERS, max_size=8))
def test_length_node_counts_code_points(minimum: int, extra: int | None, text: str) -> None:
    maximum = None if extra is None else minimum + extra
    matches = body_matcher(length_node(minimum, maximum))
    expected = minimum <= len(text) and (maximum is None or len(text) <= maximum)
    assert matches(text) == expected


def test_length_node_refuses_bad_bounds() -> None:
    with pytest.raises(GrammarError):
        length_node(3, 2)


def test_ir_stays_linear_in_the_pattern() -> None:
    def size(pattern: str) -> int:
        return sum(1 for _ in walk(pattern_node(pattern)))

    assert size("(a|b)*a(a|b){20}") == size("(a|b)*a(a|b){2}") < 200  # counts are not expanded
    words = [f"w{index}" for index in range(300)]
    assert size("(" + "|".join(words) + "){2,40}") < 6 * size("(" + "|".join(words[:60]) + ")")
