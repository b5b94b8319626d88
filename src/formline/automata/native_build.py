"""A grammar's automaton built in the native kernel from its flattened IR.

:meth:`Grammar.flat` numbers a grammar's distinct IR nodes once, children first, into flat
arrays; :func:`build_tables` hands them to the kernel (``native/pushdown_build.hpp``), which
builds each rule's Thompson NFA, determinises, trims, minimises (Hopcroft) and links them
without coming back to Python. It gives the automaton of
:func:`formline.parser.pushdown.build_pushdown_reference` (the Python NFA builder and subset
construction: the oracle of the differential tests). On 60 MaskBench schemas the Python NFA
build and determinisation were 45% of the compile time, the NFA built one list append per
state and edge; after that, the glue between the stages was 16 of 28 ms of a small schema.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import Any

import numpy as np

from formline.automata.nfa import AutomatonLimitError
from formline.grammar.budget import (
    DEFAULT_DFA_STATE_LIMIT,
    DEFAULT_NFA_STATE_LIMIT,
    CompileLimitError,
    Deadline,
    no_deadline,
)
from formline.grammar.ir import FlatGrammar, Grammar, GrammarError, expanded_size
from formline.native import build_pushdown as native_build_pushdown

NFA_LIMIT_EXCEEDED = -2
DFA_LIMIT_EXCEEDED = -3
OUT_OF_TIME = -4
NOT_PRODUCTIVE = -5
LEFT_RECURSION = -6
EXCEPT_CALLS = -7


def build_tables(
    grammar: Grammar,
    called: Collection[str],
    nfa_state_limit: int = DEFAULT_NFA_STATE_LIMIT,
    dfa_state_limit: int = DEFAULT_DFA_STATE_LIMIT,
    deadline: Deadline | None = None,
) -> dict[str, Any]:
    """The linked automaton of ``grammar`` from the kernel (``native/pushdown_build.hpp``):
    rule DFAs, productive rules, trimming, minimisation, the left-recursion check and the link,
    GIL released. Returns the kernel's dict (tables as bytes, ``rule_order`` as names).

    Raises:
        AutomatonLimitError: a rule's NFA or DFA needs more states than its limit.
        CompileLimitError: ``deadline`` passes while it is built.
        GrammarError: the grammar matches nothing, or is left-recursive.
    Costs O(NFA states) plus the subset constructions, natively; O(distinct nodes) in Python.
    """
    deadline = deadline or no_deadline()
    for name in sorted({grammar.start, *called}):
        estimate = expanded_size(grammar.rules[name])
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
    seconds = min(max(deadline.at - time.monotonic(), 0.0), 1e9)
    found = native_build_pushdown(
        *flat.arrays(),
        flat.rule_root,
        rule_called,
        flat.rule_names.index(grammar.start),
        nfa_state_limit,
        dfa_state_limit,
        seconds,
    )
    _raise_for_status(grammar, flat, found, (nfa_state_limit, dfa_state_limit), deadline)
    found["rule_order"] = [flat.rule_names[rule] for rule in found["rule_order"]]
    return found


def _raise_for_status(
    grammar: Grammar,
    flat: FlatGrammar,
    found: dict[str, Any],
    limits: tuple[int, int],
    deadline: Deadline,
) -> None:
    status = found["status"]
    rule = flat.rule_names[found["failed_rule"]] if found["failed_rule"] >= 0 else grammar.start
    if status == NFA_LIMIT_EXCEEDED:
        raise AutomatonLimitError(
            f"the grammar needs more than {limits[0]} NFA states (rule {rule!r}: large "
            "repetition counts or a very large grammar); raise the limit or simplify",
            "nfa_states",
            limits[0],
        )
    if status == DFA_LIMIT_EXCEEDED:
        raise AutomatonLimitError(
            f"the automaton needs more than {limits[1]} DFA states (rule {rule!r}: a pattern "
            "such as (a|b)*a(a|b){20} grows exponentially)",
            "dfa_states",
            limits[1],
        )
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
            f"the grammar matches no string (rule {grammar.start!r} never completes)"
        )
    if status == LEFT_RECURSION:
        raise GrammarError(
            "left recursion is not supported: "
            + " -> ".join(flat.rule_names[rule] for rule in found["cycle"])
            + " (rewrite it with repetition, e.g. 'a ::= b (op b)*')"
        )
    if status == EXCEPT_CALLS:
        raise GrammarError("the item of an Except node calls a rule")
    if status != 0:  # pragma: no cover - the kernel returns only the codes above
        raise GrammarError(f"the automaton build failed with status {status}")
