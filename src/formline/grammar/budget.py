"""What one compile may spend: wall-clock time and automaton states.

Every stage that can blow up on a small input checks the budget inside its loop: the schema
compiler once per schema object and per counted repetition it plans, the NFA builder every
:data:`CHECK_EVERY_STATES` states, the pushdown build once per rule. DFA states are made
after the compile, as decoding reaches them: their limit is checked where each is made.
A blow-up is therefore a :class:`CompileLimitError` naming the limit, raised in about the
time the limit allows, never a hang: ``{"type":"object","maxProperties":1000000000}`` used
to hold a server for 5 minutes.

State limits are part of a compiled grammar's cache key (they decide whether it compiles);
the time limit is not (it only decides whether this attempt finishes).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from formline.grammar.ir import GrammarError

DEFAULT_COMPILE_SECONDS = 10.0
DEFAULT_NFA_STATE_LIMIT = 500_000
# The lazy automaton's states in all (1 KiB each): the sample's largest schema made 23,000
# while its instances were walked; 200,000 bounds a blow-up at about 200 MB.
DEFAULT_DFA_STATE_LIMIT = 200_000
DEFAULT_STACK_LIMIT = 10_000
# A Python NFA state costs about 0.3 µs to make and 400 bytes to keep: checking the clock
# every 4,096 states adds < 0.1% and lets 500k states overrun a deadline by about 2 ms.
CHECK_EVERY_STATES = 4_096


class CompileLimitError(GrammarError):
    """A compile would pass one of its :class:`CompileBudget` limits.

    ``limit`` names the limit (``seconds``, ``nfa_states``, ``dfa_states``, ``stacks``,
    ``repetition``), ``value`` is its value."""

    def __init__(self, message: str, limit: str, value: float):
        super().__init__(message)
        self.limit = limit
        self.value = value


@dataclass(frozen=True)
class CompileBudget:
    """Limits of one compile (grammar, automata, and for a schema its grammar too).

    Attributes:
        seconds: wall-clock time for the whole compile.
        nfa_states: states of one rule's NFA (repetitions are unrolled into it).
        dfa_states: DFA states of the whole automaton, made lazily as walks and steps reach
            them (a walk that would pass it raises ``AutomatonLimitError``); the Python
            reference build applies it to each rule's DFA.
        stacks: parser stacks one step may keep (an ambiguous grammar).
    """

    seconds: float = DEFAULT_COMPILE_SECONDS
    nfa_states: int = DEFAULT_NFA_STATE_LIMIT
    dfa_states: int = DEFAULT_DFA_STATE_LIMIT
    stacks: int = DEFAULT_STACK_LIMIT

    def __post_init__(self) -> None:
        if not self.seconds > 0:
            raise ValueError(f"CompileBudget.seconds must be positive, not {self.seconds}")
        for name in ("nfa_states", "dfa_states", "stacks"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"CompileBudget.{name} must be a positive integer, not {value}")

    def state_limits(self) -> tuple[int, int, int]:
        """The limits that decide the result (part of the cache key)."""
        return (self.nfa_states, self.dfa_states, self.stacks)

    def start(self) -> Deadline:
        """A deadline ``seconds`` from now, for the stages of one compile."""
        return Deadline(time.monotonic() + self.seconds, self.seconds)


@dataclass
class Deadline:
    """The moment one compile must be done by; :meth:`check` raises past it."""

    at: float
    seconds: float

    def check(self, doing: str) -> None:
        """Raise if the deadline has passed. Costs one clock read (about 50 ns).

        Raises:
            CompileLimitError: past the deadline; the message says what was being done.
        """
        if time.monotonic() > self.at:
            raise CompileLimitError(
                f"the compile ran past its time budget of {self.seconds:g} s while {doing}; "
                "simplify the constraint or give the compile a larger budget",
                "seconds",
                self.seconds,
            )


def no_deadline() -> Deadline:
    """A deadline that never passes (callers that did not ask for a budget of time)."""
    return Deadline(float("inf"), float("inf"))
