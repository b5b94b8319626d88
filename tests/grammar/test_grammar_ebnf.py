"""EBNF/GBNF front end: parsing, positions in errors, and the languages it builds."""

from typing import Any

import pytest

from formline.grammar import Grammar, GrammarError, RuleReference
from formline.parser import build_pushdown

JSON_GBNF = r"""
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
"""


def accepts(grammar: Grammar, text: str) -> bool:
    automaton = build_pushdown(grammar)
    stacks, _ = automaton.initial()
    result = automaton.advance(stacks, text.encode("utf-8"))
    return result is not None and result[1]


def test_gbnf_json_grammar_parses_and_recognises_json() -> None:
    grammar = Grammar.from_gbnf(JSON_GBNF)
    assert set(grammar.rules) == {"root", "value", "object", "array", "string", "number", "ws"}
    assert accepts(grammar, '{"a": [1, 2.5, {"b": null}], "c": "d\\n"}')
    assert accepts(grammar, "{}")
    assert not accepts(grammar, '{"a": [1, 2,]}')
    assert not accepts(grammar, '{"a" 1}')
    assert not accepts(grammar, "[1]")  # root is an object


def test_rule_boundaries_do_not_depend_on_newlines() -> None:
    one_line = Grammar.from_ebnf('root ::= a b a ::= "x" b ::= "y" | "z"')
    assert one_line.rules["root"].items == (RuleReference("a"), RuleReference("b"))  # type: ignore[attr-defined]
    assert accepts(one_line, "xz")


def test_regex_terminals_and_repetition_operators() -> None:
    grammar = Grammar.from_ebnf(r'root ::= /[a-z]+/ ("," /[0-9]{2}/){1,3} "!"?')
    assert accepts(grammar, "abc,12")
    assert accepts(grammar, "abc,12,34,56!")
    assert not accepts(grammar, "abc,12,34,56,78")
    assert not accepts(grammar, "abc")


def test_recursive_grammar_with_nesting() -> None:
    grammar = Grammar.from_ebnf('root ::= "(" root ")" | "x"')
    assert accepts(grammar, "((((x))))")
    assert not accepts(grammar, "((x)")


@pytest.mark.parametrize(
    ("text", "position", "fragment"),
    [
        ('root ::= "abc', 9, "unterminated string"),
        ("root ::= [abc", 9, "unterminated character class"),
        ('root ::= ("a"', 9, "missing ')'"),
        ('root ::= "a" }', 13, "unexpected"),
        ("root ::= a{2,1}", 10, "max below min"),
        ('root ::= "\\q"', 10, "unknown escape"),
        ('root ::= "a"\nroot ::= "b"', 13, "defined twice"),
        ("root ::= /a(/", 11, "unterminated group"),
        ("= x", 0, "expected a rule definition"),
        ("", 0, "no rules"),
    ],
)
def test_malformed_grammar_names_the_position(text: str, position: int, fragment: str) -> None:
    with pytest.raises(GrammarError) as caught:
        Grammar.from_ebnf(text)
    assert caught.value.position == position, str(caught.value)
    assert fragment in str(caught.value)
    assert "line" in str(caught.value) and "column" in str(caught.value)


def test_gbnf_mode_refuses_regex_terminals() -> None:
    with pytest.raises(GrammarError, match="not part of GBNF"):
        Grammar.from_gbnf("root ::= /a+/")


def test_undefined_rule_and_missing_start_are_errors() -> None:
    with pytest.raises(GrammarError, match=r"rule 'b' is not defined at position 9 \(line 1"):
        Grammar.from_ebnf("root ::= b")
    # named where it is first referenced: line 2, column 13
    with pytest.raises(GrammarError, match=r"rule 'c' is not defined .*line 2, column 13"):
        Grammar.from_ebnf('root ::= "a" b\nb ::= "x" | c\nd ::= c')
    with pytest.raises(GrammarError, match="start rule 'main'"):
        Grammar.from_ebnf('root ::= "a"', start="main")


def test_left_recursion_is_refused_with_the_cycle() -> None:
    with pytest.raises(GrammarError, match=r"left recursion.*expr -> expr"):
        build_pushdown(Grammar.from_ebnf('root ::= expr\nexpr ::= expr "+" "1" | "1"'))
    with pytest.raises(GrammarError, match="left recursion"):
        build_pushdown(Grammar.from_ebnf('root ::= a\na ::= b "x" | "y"\nb ::= "" a'))


def test_grammar_matching_nothing_is_refused() -> None:
    with pytest.raises(GrammarError, match="matches no string"):
        build_pushdown(Grammar.from_ebnf('root ::= "a" root'))


@pytest.mark.parametrize(
    ("spaced", "tight"),
    [
        ('root ::= "a" *', 'root ::= "a"*'),
        ("root ::= [a-z] +", "root ::= [a-z]+"),
        ('root ::= ( "a" ) ?', 'root ::= ("a")?'),
        ('root ::= "a" {2}', 'root ::= "a"{2}'),
        ('root ::= "a"{2,\t3}', 'root ::= "a"{2,3}'),
        ('root ::= ("a"\n  *)', 'root ::= ("a")*'),
    ],
)
def test_an_operator_may_follow_a_space_as_in_llama_cpp(spaced: str, tight: str) -> None:
    # llama.cpp skips spaces after an element: '"a" *' was "unexpected '*'".
    assert Grammar.from_gbnf(spaced).rules == Grammar.from_gbnf(tight).rules


def test_an_operator_on_the_next_line_of_a_rule_is_still_an_error() -> None:
    with pytest.raises(GrammarError, match="line 2"):
        Grammar.from_gbnf('root ::= "a"\n  *')


@pytest.mark.parametrize(
    ("make", "value"),
    [
        (Grammar.from_regex, b"abc"),
        (Grammar.from_regex, None),
        (Grammar.from_gbnf, b'root ::= "a"'),
        (Grammar.from_ebnf, None),
        (Grammar.from_choices, "yes"),  # it was read as the choices y, e and s
        (Grammar.from_choices, [1, 2]),
    ],
)
def test_values_of_the_wrong_type_are_type_errors(make: Any, value: Any) -> None:
    with pytest.raises(TypeError, match="must be"):  # a bare AttributeError, or misread
        make(value)


def test_a_choice_that_is_not_text_is_named_by_its_index() -> None:
    # The position alone (0) did not say which of the choices it was in.
    with pytest.raises(GrammarError, match="choice 1: U\\+DFFF is a lone surrogate"):
        Grammar.from_choices(["ok", "\udfff"])
