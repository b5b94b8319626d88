"""The pushdown parser: inlining, recursion, tail calls, ambiguity and limits."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from formline.grammar import Grammar
from formline.grammar.ir import Literal, RuleReference, Sequence
from formline.parser import ParserLimitError, build_pushdown
from formline.parser.pushdown import recursive_rules


def test_non_recursive_grammar_is_one_automaton_without_calls() -> None:
    grammar = Grammar.from_ebnf('root ::= a "," a\na ::= b b\nb ::= [0-9] | "x"')
    automaton = build_pushdown(grammar)
    assert automaton.rule_names == ["root"]
    assert not any(automaton.calls)


def test_recursive_rules_keep_their_own_automaton() -> None:
    grammar = Grammar.from_ebnf(
        'root ::= "<" list ">"\nlist ::= item ("," item)*\nitem ::= "x" | "[" list "]"'
    )
    automaton = build_pushdown(grammar)
    assert set(automaton.rule_names) == {"root", "list", "item"}  # a recursion cycle
    stacks, _ = automaton.initial()
    result = automaton.advance(stacks, b"<x,[x,[x]],x>")
    assert result is not None and result[1]
    assert automaton.advance(stacks, b"<x,[x>") is None


def reaches_itself(edges: dict[str, set[str]], rule: str) -> bool:
    """The plain definition: some chain of references from ``rule`` comes back to it."""
    seen: set[str] = set()
    pending = list(edges[rule])
    while pending:
        other = pending.pop()
        if other == rule:
            return True
        if other not in seen:
            seen.add(other)
            pending.extend(edges[other])
    return False


@given(st.lists(st.sets(st.integers(0, 7), max_size=3), min_size=8, max_size=8))
@settings(max_examples=200, deadline=None)
def test_recursive_rules_are_those_that_reach_themselves(references) -> None:
    # The kernel's Tarjan against reachability, on random reference graphs of 8 rules.
    names = [f"r{k}" for k in range(8)]
    edges = {names[k]: {names[other] for other in references[k]} for k in range(8)}
    rules = {
        name: Sequence((Literal(name.encode()), *(RuleReference(o) for o in sorted(edges[name]))))
        for name in names
    }
    grammar = Grammar(rules, "r0")
    assert recursive_rules(grammar) == {name for name in names if reaches_itself(edges, name)}


def test_right_recursion_runs_in_constant_stack_depth() -> None:
    automaton = build_pushdown(Grammar.from_ebnf('root ::= "a" root | "b"'))
    stacks, _ = automaton.initial()
    result = automaton.advance(stacks, b"a" * 500)
    assert result is not None
    assert max(len(stack) for stack in result[0]) <= 2  # tail calls push no return frame
    final = automaton.advance(result[0], b"b")
    assert final is not None and final[1]


def test_ambiguous_grammar_is_bounded_by_the_stack_limit() -> None:
    # e and f have the same language: after n "(" there are 2^n ways to have got there.
    grammar = Grammar.from_ebnf(
        'root ::= e\ne ::= "(" e ")" | "(" f ")" | "x"\nf ::= "(" e ")" | "(" f ")" | "x"'
    )
    automaton = build_pushdown(grammar, stack_limit=50)
    stacks, _ = automaton.initial()
    with pytest.raises(ParserLimitError, match="more than 50 stacks"):
        automaton.advance(stacks, b"(" * 60)


def test_ambiguity_is_followed_on_all_branches() -> None:
    grammar = Grammar.from_ebnf('root ::= p\np ::= "a" p "b" | "a" p "c" | ""')
    automaton = build_pushdown(grammar)
    stacks, _ = automaton.initial()
    assert automaton.initial()[1]  # the empty string
    for text, expected in [(b"aabc", True), (b"aacb", True), (b"aab", False), (b"abc", False)]:
        result = automaton.advance(stacks, text)
        assert (result is not None and result[1]) == expected, text
