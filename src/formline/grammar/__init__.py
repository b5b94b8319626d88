"""Tokenizer-free grammars: the IR and its front ends (regex, choices, EBNF, GBNF)."""

from formline.grammar.ir import (
    EMPTY,
    ByteSet,
    Choice,
    Grammar,
    GrammarError,
    Literal,
    Node,
    Repeat,
    RuleReference,
    Sequence,
)

__all__ = [
    "EMPTY",
    "ByteSet",
    "Choice",
    "Grammar",
    "GrammarError",
    "Literal",
    "Node",
    "Repeat",
    "RuleReference",
    "Sequence",
]
