"""A grammar's automaton built in the native kernel from its flattened IR, lazily.

:meth:`Grammar.flat` numbers a grammar's distinct IR nodes once, children first, into flat
arrays; :func:`build_lazy` hands them to the kernel (``native/lazy_build.hpp``). When the IR
shows that every callable rule surely derives a string and none calls itself before a byte
(``native/ir_facts.hpp``: all but one of the MaskBench sample's multi-rule schemas), it
builds the start rule's Thompson NFA and makes the start state; every other rule's NFA is
built the first time a DFA state calls it. Otherwise it builds each needed rule's NFA,
finds the productive rules, trims each NFA to the states that can still finish, refuses
left recursion and makes the start state. Every other DFA state is made the first time a
walk or a parser step reaches it (``native/automaton.hpp``):
the eager build (determinise, trim, minimise, link, natively) was 1.1 ms of a median
MaskBench schema's 2.7 ms to first mask and 24 of the slowest tenth's 36 ms. It gives the
language of :func:`formline.parser.pushdown.build_pushdown_reference` (the Python NFA
builder and subset construction, minimised: the oracle of the differential tests).
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np

from formline.automata.nfa import AutomatonLimitError
from formline.grammar.budget import (
    DEFAULT_DFA_STATE_LIMIT,
    DEFAULT_NFA_STATE_LIMIT,
    DEFAULT_STACK_LIMIT,
    CompileLimitError,
    Deadline,
    no_deadline,
)
from formline.grammar.ir import FlatGrammar, Grammar, GrammarError
from formline.native import NativeAutomaton
from formline.native import build_automaton as native_build_automaton

NFA_LIMIT_EXCEEDED = -2
DFA_LIMIT_EXCEEDED = -3
OUT_OF_TIME = -4
NOT_PRODUCTIVE = -5
LEFT_RECURSION = -6
EXCEPT_CALLS = -7
MALFORMED = -8


@dataclass(frozen=True)
class AutomatonSource:
    """What a lazy automaton is built from, all of it (the disk store keeps this): the
    flattened IR, per rule whether it is entered by calls (``rule_called``, uint8), the start
    rule's index and the limits."""

    flat: FlatGrammar
    rule_called: np.ndarray
    start: int
    nfa_state_limit: int = DEFAULT_NFA_STATE_LIMIT
    dfa_state_limit: int = DEFAULT_DFA_STATE_LIMIT
    stack_limit: int = DEFAULT_STACK_LIMIT


def source_of(
    grammar: Grammar,
    called: Collection[str],
    nfa_state_limit: int = DEFAULT_NFA_STATE_LIMIT,
    dfa_state_limit: int = DEFAULT_DFA_STATE_LIMIT,
    stack_limit: int = DEFAULT_STACK_LIMIT,
) -> AutomatonSource:
    """The build's inputs for ``grammar`` with the rules ``called`` entered by calls.

    Raises:
        AutomatonLimitError: a called rule's estimated NFA is over ``nfa_state_limit``.
    Costs O(rules)."""
    for name in sorted({grammar.start, *called}):
        estimate = grammar.rule_size(name)
        if estimate > nfa_state_limit:
            # Known before anything is built: (a{1000}){1000} used to build 500,000 states.
            raise AutomatonLimitError(
                f"the grammar needs about {estimate:,} NFA states, more than the limit of "
                f"{nfa_state_limit:,} (large repetition counts or a very large grammar); "
                "simplify it or give the compile a larger budget",
                "nfa_states",
                nfa_state_limit,
            )
    flat = grammar.flat()
    rule_called = np.array([name in called for name in flat.rule_names], dtype=np.uint8)
    start = flat.rule_names.index(grammar.start)
    return AutomatonSource(flat, rule_called, start, nfa_state_limit, dfa_state_limit, stack_limit)


def build_lazy(
    source: AutomatonSource, deadline: Deadline | None = None
) -> tuple[NativeAutomaton, list[str]]:
    """The lazy automaton of ``source`` from the kernel, GIL released, at most its
    ``dfa_state_limit`` DFA states in all (made as decoding reaches them), and the names of
    the rules it may have states of, the start first (a state's rule index,
    ``NativeAutomaton.state``, reads into the grammar's sorted rule names). A rule built
    lazily is surely within the NFA limit (a bound from the IR, or built now to check).

    Raises:
        AutomatonLimitError: a rule's NFA needs more states than its limit.
        CompileLimitError: ``deadline`` passes while it is built.
        GrammarError: the grammar matches nothing, is left-recursive, or its arrays are
            malformed (a stored entry: an index out of range).
    Costs O(NFA states) natively, the start rule's alone where the rest may be lazy (no DFA
    is built here): about 0.05-0.1 ms for a median MaskBench schema, 0.3-0.4 ms for the
    slowest tenth (0.7-0.8 with every NFA built now).
    """
    deadline = deadline or no_deadline()
    flat = source.flat
    seconds = min(max(deadline.at - time.monotonic(), 0.0), 1e9)
    found = native_build_automaton(
        *flat.arrays(),
        flat.rule_root,
        source.rule_called,
        source.start,
        source.nfa_state_limit,
        source.dfa_state_limit,
        source.stack_limit,
        seconds,
    )
    _raise_for_status(source, found, deadline)
    return found["automaton"], [flat.rule_names[rule] for rule in found["rule_order"]]


def _raise_for_status(source: AutomatonSource, found: dict[str, Any], deadline: Deadline) -> None:
    status = found["status"]
    names = source.flat.rule_names
    limits = (source.nfa_state_limit, source.dfa_state_limit)
    rule = names[found["failed_rule"]] if found["failed_rule"] >= 0 else names[source.start]
    if status == MALFORMED:
        raise GrammarError("the flattened grammar's arrays are malformed (an index out of range)")
    if status == NFA_LIMIT_EXCEEDED:
        raise AutomatonLimitError(
            f"the grammar needs more than {limits[0]} NFA states (rule {rule!r}: large "
            "repetition counts or a very large grammar); raise the limit or simplify",
            "nfa_states",
            limits[0],
        )
    if status == DFA_LIMIT_EXCEEDED:
        raise state_limit_error(limits[1])
    if status == OUT_OF_TIME:
        doing = f"building the automaton of rule {rule!r} ({found['nfa_states']} NFA states)"
        deadline.check(doing)
        raise CompileLimitError(  # the kernel's clock passed first: the same limit
            f"the compile ran past its time budget of {deadline.seconds:g} s while {doing}",
            "seconds",
            deadline.seconds,
        )
    if status == NOT_PRODUCTIVE:
        raise GrammarError(
            f"the grammar matches no string (rule {names[source.start]!r} never completes)"
        )
    if status == LEFT_RECURSION:
        raise GrammarError(
            "left recursion is not supported: "
            + " -> ".join(names[rule] for rule in found["cycle"])
            + " (rewrite it with repetition, e.g. 'a ::= b (op b)*')"
        )
    if status == EXCEPT_CALLS:
        raise GrammarError("the item of an Except node calls a rule")
    if status != 0:  # pragma: no cover - the kernel returns only the codes above
        raise GrammarError(f"the automaton build failed with status {status}")


def state_limit_error(limit: int) -> AutomatonLimitError:
    """The error of an automaton that needs more DFA states than ``limit`` (raised where a
    walk or a step would have to make one past it)."""
    return AutomatonLimitError(
        f"the automaton needs more than {limit} DFA states (made as decoding reaches them: a "
        "pattern such as (a|b)*a(a|b){20} can need 2^21); give the compile a larger budget",
        "dfa_states",
        limit,
    )
