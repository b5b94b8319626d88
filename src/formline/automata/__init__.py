"""Byte-level automata: Thompson NFAs, subset construction, trimming and minimisation."""

from formline.automata.dfa import DEFAULT_DFA_STATE_LIMIT, Dfa, determinize, minimize, trim
from formline.automata.nfa import AutomatonLimitError, Nfa, build_nfa

__all__ = [
    "DEFAULT_DFA_STATE_LIMIT",
    "AutomatonLimitError",
    "Dfa",
    "Nfa",
    "build_nfa",
    "determinize",
    "minimize",
    "trim",
]
