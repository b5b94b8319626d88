"""The CFG parser: a byte-level pushdown automaton over per-rule DFAs."""

from formline.parser.pushdown import (
    BASE,
    ParserLimitError,
    PushdownAutomaton,
    Stack,
    build_pushdown,
)

__all__ = ["BASE", "ParserLimitError", "PushdownAutomaton", "Stack", "build_pushdown"]
