"""Regex front end: the language of the compiled DFA equals Python's re.fullmatch (ASCII mode)."""

import re

import pytest

from formline.automata import build_nfa, determinize, minimize, trim
from formline.grammar import Grammar, GrammarError
from formline.grammar.regex import parse_regex
from formline.parser import build_pushdown


def regex_dfa(pattern: str):
    nfa = build_nfa(parse_regex(pattern), lambda name: None, lambda name: False)
    trimmed = trim(determinize(nfa), set())
    assert trimmed is not None
    return minimize(trimmed)


CASES = [
    (r"[a-z]+@[a-z]+\.com", ["ab@cd.com", "x@.com", "@a.com", "a@b.comm"]),
    (r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?", ["0", "-0.5", "01", "1e5", "1.", "12E-3"]),
    (r"(cat|dog)s?", ["cat", "dogs", "cats", "catdog", ""]),
    (r"a{2,4}b{3}", ["aab", "aabbb", "aaaabbb", "aaaaabbb", "abbb"]),
    (r"a{2,}", ["a", "aa", "aaaaaa"]),
    (r"x{,2}y", ["y", "xy", "xxy", "xxxy"]),
    (r"\d\w\s", ["1a ", "a1 ", "1_\t", "11\n"]),
    (r"\D\W\S", ["a!b", "1!b", "a b", "a!\n"]),
    (r"[^a-c]", ["a", "d", "é", "\n", "中"]),
    (r".", ["a", "\n", "é", "😀", ""]),
    (r"é+|ü|中文", ["éé", "ü", "中文", "e", "中"]),
    (r"[\u00e0-\u00ff\u4e00-\u9fff]+", ["àÿ", "中文字", "a", "Ā"]),
    (r"\x41\u00e9\n\t", ["Aé\n\t", "Ae\n\t"]),
    (r"^abc$", ["abc", "abcd"]),
    (r"(?:ab)*(?P<name>c)", ["c", "ababc", "abac"]),
    (r"[-a]+[a-]", ["a-", "--", "ab"]),
    (r"a*?b+?", ["b", "aabb", "a"]),
    (r"a|", ["", "a", "aa"]),
    (r"[\]\\]+", ["]\\", "]", "a"]),
    (r"{abc}", ["{abc}", "abc"]),
    # Python reads \0 and up to two octal digits as one escape (\012 was NUL then "12").
    (r"\012|\01|[\012]x", ["\n", "\x01", "\nx", "\x0012", "\x001"]),
    # Spaces make a brace literal text (a{ 2} was aa); {,} is *; {} stays literal.
    (r"a{ 2}|b{2, 3}|c{2 }", ["aa", "a{ 2}", "bb", "b{2, 3}", "c{2 }", "cc"]),
    (r"a{,}b{}", ["b{}", "aaab{}", "a{,}b{}", "b"]),
]


@pytest.mark.parametrize(("pattern", "strings"), CASES)
def test_dfa_language_equals_python_re(pattern: str, strings: list[str]) -> None:
    dfa = regex_dfa(pattern)
    for text in strings:
        expected = re.fullmatch(pattern, text, re.ASCII) is not None
        assert dfa.matches(text.encode("utf-8")) == expected, (pattern, text)


def test_unicode_classes_produce_valid_utf8_only() -> None:
    dfa = regex_dfa(r"[^x]")
    assert dfa.matches("\U0010ffff".encode())
    assert not dfa.matches(b"\xed\xa0\x80")  # an encoded surrogate is not UTF-8
    assert not dfa.matches(b"\xff")
    assert not dfa.matches(b"\xc0\x80")  # overlong encoding of NUL


@pytest.mark.parametrize(
    ("pattern", "position", "fragment"),
    [
        ("(ab", 0, "unterminated group"),
        ("ab)", 2, "unbalanced"),
        ("[abc", 0, "unterminated character set"),
        ("*a", 0, "nothing to repeat"),
        ("a**", 2, "multiple repeat"),
        ("a(?=b)", 1, "unsupported group"),
        (r"a\bc", 1, "unsupported escape"),
        (r"(a)\1", 3, "unsupported escape"),
        ("a^b", 1, "'^'"),
        ("a$b", 1, "'$'"),
        ("[z-a]", 0, "bad character range"),
        ("a{3,1}", 1, "min repeat greater"),
        (r"\xZZ", 0, "bad escape"),
        ("a{1000001}", 1, "repetition count"),
        ("a{2}{3}", 4, "multiple repeat"),  # was read as a{6}; Python and ECMA refuse it
        ("a{2}?{3}", 5, "multiple repeat"),
    ],
)
def test_malformed_regex_names_the_position(pattern: str, position: int, fragment: str) -> None:
    with pytest.raises(GrammarError) as caught:
        Grammar.from_regex(pattern)
    assert caught.value.position == position
    assert fragment in str(caught.value)
    assert f"position {position}" in str(caught.value)


def test_choices_grammar_matches_exactly_the_choices() -> None:
    from formline.parser import build_pushdown

    automaton = build_pushdown(Grammar.from_choices(["yes", "no", "yes, maybe"]))
    initial, _ = automaton.initial()
    for text, expected in [
        ("yes", True),
        ("no", True),
        ("yes, maybe", True),
        ("ye", False),
        ("nope", False),
    ]:
        result = automaton.advance(initial, text.encode())
        assert (result is not None and result[1]) == expected, text
    with pytest.raises(GrammarError):
        Grammar.from_choices([])


def test_many_braces_parse_in_linear_time() -> None:
    # Each '{' scanned to the next '}': 100,000 of them took 6.8 s, twice as many 28.9 s.
    parse_regex("a{" * 200_000 + "}")  # 0.3-0.6 s now; the suite's timeout is the bound


def test_a_count_with_thousands_of_leading_zeros_is_read_as_its_value() -> None:
    # The length check dropped the zeros and int() read them all: a bare ValueError past
    # Python's 4,300 digits (a 500 in the server).
    zeros = "0" * 10_000
    built = build_pushdown(Grammar.from_regex("a{" + zeros + "2}"))
    assert built.matches(b"aa") and not built.matches(b"a")
    ebnf = build_pushdown(Grammar.from_ebnf('root ::= "a"{' + zeros + "2," + zeros + "3}"))
    assert ebnf.matches(b"aaa") and not ebnf.matches(b"aaaa")
    with pytest.raises(GrammarError, match="repetition count"):
        Grammar.from_regex("a{" + zeros + "10000001}")


@pytest.mark.parametrize(
    ("pattern", "same_as", "longest"),
    [
        ("(a?){100000}", "a{0,100000}", 100_000),
        ("((a|b)?){3,9}", "(a|b){0,9}", 9),
        ("(a*){2,5}", "a*", None),
    ],
)
def test_an_optional_items_copies_are_one_repetition(
    pattern: str, same_as: str, longest: int | None
) -> None:
    # Each copy of a nullable item is crossed without a byte: a DFA state of (a?){100000}
    # held every copy, and 3,000 bytes took 36 s and 2.4 GB to walk.
    assert Grammar.from_regex(pattern).rules == Grammar.from_regex(same_as).rules
    automaton = build_pushdown(Grammar.from_regex(pattern))
    assert automaton.matches(b"") and automaton.matches(b"a" * min(longest or 3_000, 3_000))
    assert automaton.matches(b"a" * 3_001) == (longest is None or longest > 3_001)
