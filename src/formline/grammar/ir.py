"""The tokenizer-free grammar IR.

A :class:`Grammar` is a set of named rules over *bytes*. Each rule body is a tree of
:class:`Node` objects: byte sets (one byte from a set of ranges), literals, sequences,
alternations, bounded or unbounded repetitions and references to other rules. Regular
expressions, choice lists, EBNF and llama.cpp GBNF texts all lower to this one form, so the
automata and the parser never see where a grammar came from.

Unicode is handled by the front ends: a character class becomes an alternation of UTF-8 byte
sequences (see :mod:`formline.grammar.utf8`), so the IR itself is purely byte-level.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field


class GrammarError(ValueError):
    """A grammar is malformed or cannot be compiled.

    ``position`` is the character offset in the source text where the problem was found
    (``None`` when the problem is not tied to one place, e.g. left recursion).
    """

    def __init__(self, message: str, position: int | None = None, source: str | None = None):
        self.message = message
        self.position = position
        self.source = source
        where = ""
        if position is not None:
            where = f" at position {position}"
            if source is not None:
                line = source.count("\n", 0, position) + 1
                column = position - (source.rfind("\n", 0, position) + 1) + 1
                where += f" (line {line}, column {column})"
        super().__init__(f"{message}{where}")


class Node:
    """Base class of grammar IR nodes (immutable, hashable)."""

    __slots__ = ()

    def children(self) -> tuple[Node, ...]:
        return ()


@dataclass(frozen=True, slots=True)
class ByteSet(Node):
    """One byte from a union of inclusive ranges, e.g. ``((0x30, 0x39),)`` for a digit."""

    ranges: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        for low, high in self.ranges:
            if not 0 <= low <= high <= 255:
                raise GrammarError(f"invalid byte range {low}-{high}")

    def contains(self, value: int) -> bool:
        return any(low <= value <= high for low, high in self.ranges)


@dataclass(frozen=True, slots=True)
class Literal(Node):
    """An exact byte string (possibly empty: the empty string matches only itself)."""

    value: bytes


@dataclass(frozen=True, slots=True)
class Sequence(Node):
    """Items one after another."""

    items: tuple[Node, ...]

    def children(self) -> tuple[Node, ...]:
        return self.items


@dataclass(frozen=True, slots=True)
class Choice(Node):
    """Any one of the options."""

    options: tuple[Node, ...]

    def children(self) -> tuple[Node, ...]:
        return self.options


@dataclass(frozen=True, slots=True)
class Repeat(Node):
    """``item`` repeated between ``minimum`` and ``maximum`` times (``None``: unbounded)."""

    item: Node
    minimum: int = 0
    maximum: int | None = None

    def __post_init__(self) -> None:
        if self.minimum < 0 or (self.maximum is not None and self.maximum < self.minimum):
            raise GrammarError(f"invalid repetition bounds {{{self.minimum},{self.maximum}}}")

    def children(self) -> tuple[Node, ...]:
        return (self.item,)


@dataclass(frozen=True, slots=True)
class RuleReference(Node):
    """A reference to another rule of the same grammar, by name."""

    name: str


EMPTY = Literal(b"")


def optional(node: Node) -> Node:
    """``node?``: zero or one time."""
    return Repeat(node, 0, 1)


def walk(node: Node) -> Iterator[Node]:
    """All nodes of a tree, depth first (iterative: deep trees do not hit the recursion limit)."""
    pending = [node]
    while pending:
        current = pending.pop()
        yield current
        pending.extend(current.children())


@dataclass(frozen=True)
class Grammar:
    """A context-free grammar over bytes: named rules and a start rule.

    Build one with :meth:`from_regex`, :meth:`from_choices`, :meth:`from_ebnf` or
    :meth:`from_gbnf`. Construction validates that every referenced rule exists.

    Raises:
        GrammarError: the start rule or a referenced rule is missing.
    """

    rules: dict[str, Node]
    start: str = "root"
    source: str = field(default="", compare=False)
    # Rules entered through call edges even when they are not recursive. Inlining copies a
    # rule into every caller, so a sub-grammar referenced from n places (or a chain of rules
    # that each reference the next two) costs n copies; a called rule costs one DFA.
    called_rules: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.start not in self.rules:
            raise GrammarError(f"start rule {self.start!r} is not defined")
        for name, body in self.rules.items():
            for node in walk(body):
                if isinstance(node, RuleReference) and node.name not in self.rules:
                    raise GrammarError(f"rule {name!r} references undefined rule {node.name!r}")
        unknown = sorted(self.called_rules - self.rules.keys())
        if unknown:
            raise GrammarError(f"called rules {unknown} are not defined")

    def fingerprint(self) -> str:
        """A stable hash of the rules (the cache key of compiled grammars). Costs O(size)."""
        digest = hashlib.sha256()
        digest.update(self.start.encode())
        for name in sorted(self.rules):
            digest.update(b"\x00" + name.encode() + b"\x01" + repr(self.rules[name]).encode())
        for name in sorted(self.called_rules):
            digest.update(b"\x02" + name.encode())
        return digest.hexdigest()

    @classmethod
    def from_regex(cls, pattern: str) -> Grammar:
        """A grammar for strings that fully match ``pattern`` (see :mod:`.regex`)."""
        from formline.grammar.regex import parse_regex

        return cls({"root": parse_regex(pattern)}, "root", source=pattern)

    @classmethod
    def from_choices(cls, choices: list[str] | tuple[str, ...]) -> Grammar:
        """A grammar for exactly one of ``choices``.

        Raises:
            GrammarError: the list is empty.
        """
        if not choices:
            raise GrammarError("a choice grammar needs at least one choice")
        options = tuple(Literal(choice.encode("utf-8")) for choice in dict.fromkeys(choices))
        return cls({"root": Choice(options)}, "root")

    @classmethod
    def from_ebnf(cls, text: str, start: str = "root") -> Grammar:
        """A grammar from formline's EBNF text (GBNF plus ``/regex/`` terminals)."""
        from formline.grammar.ebnf import parse_ebnf

        return cls(parse_ebnf(text), start, source=text)

    @classmethod
    def from_gbnf(cls, text: str) -> Grammar:
        """A grammar from a llama.cpp GBNF text (start rule ``root``)."""
        from formline.grammar.ebnf import parse_ebnf

        return cls(parse_ebnf(text, allow_regex=False), "root", source=text)
