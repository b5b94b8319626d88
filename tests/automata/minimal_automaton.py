"""The lazy build's automaton minimised rule by rule, into the form of the Python reference
build's: each rule's DFA (as the lazy subset construction made it, every state made first)
minimised, then linked start first and the other rules by name. Two automata of the same
grammar are then equal state by state (``canonical``)."""

import numpy as np

from formline.automata.dfa import Dfa, minimize
from formline.parser.pushdown import PushdownAutomaton, _link


def minimized(automaton: PushdownAutomaton) -> PushdownAutomaton:
    """``automaton`` with each rule's DFA minimised (every state made first)."""
    tables = automaton.tables()
    transitions, accepting, rules = (
        tables["transitions"], tables["accepting"], tables["rule_of_state"],
    )  # fmt: skip
    names = automaton.rule_names
    starts = {int(rules[0]): 0}  # a rule's start: state 0, or the state its callers enter
    for callee in tables["call_callee"].tolist():
        starts.setdefault(int(rules[callee]), callee)
    dfas = {}
    for rule, start in starts.items():
        local = {start: 0}
        order = [start]
        for state in order:  # the rule's states: from its start over bytes and returns
            reached = [t for t in transitions[state].tolist() if t >= 0]
            for target in reached + [back for _, back in automaton.calls_of(state)]:
                if target not in local:
                    local[target] = len(order)
                    order.append(target)
        table = np.array(
            [[local[t] if t >= 0 else -1 for t in transitions[s].tolist()] for s in order],
            dtype=np.int32,
        ).reshape(len(order), 256)
        calls = [
            [(names[int(rules[callee])], local[back]) for callee, back in automaton.calls_of(s)]
            for s in order
        ]
        dfas[names[rule]] = minimize(Dfa(table, accepting[order], calls))
    return _link(names[int(rules[0])], dfas, automaton.stack_limit)


def canonical(automaton: PushdownAutomaton) -> list[tuple[bool, tuple[int, ...], tuple, str]]:
    """The automaton renumbered breadth-first from its start (bytes in order, then calls),
    each state with its rule's name: two automata linked from the same minimal rule DFAs are
    equal here."""
    number = {automaton.start: 0}
    order = [automaton.start]
    rows = []
    transitions = automaton.transitions
    rules = automaton.rule_of_state
    for state in order:
        row = transitions[state].tolist()
        calls = automaton.calls_of(state)
        for target in row + [t for edge in calls for t in edge]:
            if target >= 0 and target not in number:
                number[target] = len(order)
                order.append(target)
        mapped = tuple(number[t] if t >= 0 else -1 for t in row)
        called = tuple((number[c], number[r]) for c, r in calls)
        name = automaton.rule_names[int(rules[state])]
        rows.append((bool(automaton.is_accepting(state)), mapped, called, name))
    return rows
