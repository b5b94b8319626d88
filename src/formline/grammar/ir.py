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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from formline.errors import FormlineError
from formline.native import flatten_rules


class GrammarError(FormlineError, ValueError):
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
    """Base class of grammar IR nodes (immutable, hashable).

    Schema compilers share subtrees (an array's item appears in its first and its repeated
    position), so an IR is a DAG whose tree can be exponentially larger: 20 nested arrays
    are 2^20 tree nodes over 60 distinct ones. Everything here is therefore linear in the
    *distinct* nodes: the hash is computed once at construction from the children's cached
    hashes, :func:`walk` visits a shared node once, and :meth:`Grammar.fingerprint` numbers
    nodes instead of printing the tree (a printed tree also recursed once per level: a
    ``minimum`` of 1e150 overflowed the stack).

    Plain slotted classes, not frozen dataclasses: a dataclass's generated ``__init__`` and
    ``__post_init__`` made a three-item ``Sequence`` cost 3.0 µs, about a third of a median
    MaskBench schema's grammar construction; these cost about 0.7 µs. Assigning an attribute
    raises ``AttributeError``, as a frozen dataclass does.
    """

    __slots__ = ("_hash", "_size")
    field_names: ClassVar[tuple[str, ...]] = ()  # in the order of fields() and __init__
    _hash: int
    _size: int  # what :func:`expanded_size` answers, computed at construction

    def children(self) -> tuple[Node, ...]:
        return ()

    def fields(self) -> tuple[object, ...]:
        raise NotImplementedError

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(other) is not type(self) or hash(other) != self._hash:
            return False
        assert isinstance(other, Node)
        return self.fields() == other.fields()

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"grammar nodes are immutable: cannot assign {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"grammar nodes are immutable: cannot delete {name!r}")

    def __repr__(self) -> str:
        pairs = zip(self.field_names, self.fields(), strict=True)
        shown = ", ".join(f"{name}={value!r}" for name, value in pairs)
        return f"{type(self).__name__}({shown})"

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), self.fields())


def slot_setter(cls: type, name: str) -> Callable[[Any, Any], None]:
    """The setter of slot ``name`` of ``cls``: the nodes' fields are written through their
    slots' own setters, not ``object.__setattr__``, which looks the slot up on the type at
    every write (a Literal 0.29 -> 0.20 µs, interpreted; a big schema makes thousands)."""
    setter: Callable[[Any, Any], None] = cls.__dict__[name].__set__
    return setter


# The children's hashes and sizes are cached already, so a node costs O(children), not
# O(subtree). The size is what :func:`expanded_size` answers: the schema compiler asks it of
# every member and array item (5,946 tree walks, 15% of 60 MaskBench compiles).
_set_hash = slot_setter(Node, "_hash")
_set_size = slot_setter(Node, "_size")


def _set_composite(
    node: Node, set_children: Callable[[Any, Any], None], kind: int, children: tuple[Node, ...]
) -> None:
    """A sequence's or choice's fields: its children, hash and expanded size."""
    set_children(node, children)
    _set_hash(node, hash((kind, children)))
    size = 0
    for child in children:
        size += child._size
    _set_size(node, size or 1)


class ByteSet(Node):
    """One byte from a union of inclusive ranges, e.g. ``((0x30, 0x39),)`` for a digit."""

    __slots__ = ("ranges",)
    field_names = ("ranges",)
    ranges: tuple[tuple[int, int], ...]

    def __init__(self, ranges: tuple[tuple[int, int], ...]) -> None:
        for low, high in ranges:
            if not 0 <= low <= high <= 255:
                raise GrammarError(f"invalid byte range {low}-{high}")
        _set_ranges(self, ranges)
        _set_hash(self, hash((0, ranges)))
        _set_size(self, 1)

    def fields(self) -> tuple[object, ...]:
        return (self.ranges,)

    def contains(self, value: int) -> bool:
        return any(low <= value <= high for low, high in self.ranges)


_set_ranges = slot_setter(ByteSet, "ranges")


class Literal(Node):
    """An exact byte string (possibly empty: the empty string matches only itself)."""

    __slots__ = ("value",)
    field_names = ("value",)
    value: bytes

    def __init__(self, value: bytes) -> None:
        _set_value(self, value)
        _set_hash(self, hash((1, value)))
        _set_size(self, len(value) or 1)

    def fields(self) -> tuple[object, ...]:
        return (self.value,)


_set_value = slot_setter(Literal, "value")


class Sequence(Node):
    """Items one after another."""

    __slots__ = ("items",)
    field_names = ("items",)
    items: tuple[Node, ...]

    def __init__(self, items: tuple[Node, ...]) -> None:
        _set_composite(self, _set_items, 2, items)

    def fields(self) -> tuple[object, ...]:
        return (self.items,)

    def children(self) -> tuple[Node, ...]:
        return self.items


_set_items = slot_setter(Sequence, "items")


class Choice(Node):
    """Any one of the options."""

    __slots__ = ("options",)
    field_names = ("options",)
    options: tuple[Node, ...]

    def __init__(self, options: tuple[Node, ...]) -> None:
        _set_composite(self, _set_options, 3, options)

    def fields(self) -> tuple[object, ...]:
        return (self.options,)

    def children(self) -> tuple[Node, ...]:
        return self.options


_set_options = slot_setter(Choice, "options")


class Repeat(Node):
    """``item`` repeated between ``minimum`` and ``maximum`` times (``None``: unbounded)."""

    __slots__ = ("item", "maximum", "minimum")
    field_names = ("item", "minimum", "maximum")
    item: Node
    minimum: int
    maximum: int | None

    def __init__(self, item: Node, minimum: int = 0, maximum: int | None = None) -> None:
        if minimum < 0 or (maximum is not None and maximum < minimum):
            raise GrammarError(f"invalid repetition bounds {{{minimum},{maximum}}}")
        _set_repeat_item(self, item)
        _set_minimum(self, minimum)
        _set_maximum(self, maximum)
        _set_hash(self, hash((4, item, minimum, maximum)))
        _set_size(self, item._size * max(maximum or minimum, 1))

    def fields(self) -> tuple[object, ...]:
        return (self.item, self.minimum, self.maximum)

    def children(self) -> tuple[Node, ...]:
        return (self.item,)


_set_repeat_item = slot_setter(Repeat, "item")
_set_minimum = slot_setter(Repeat, "minimum")
_set_maximum = slot_setter(Repeat, "maximum")


class RuleReference(Node):
    """A reference to another rule of the same grammar, by name."""

    __slots__ = ("name",)
    field_names = ("name",)
    name: str

    def __init__(self, name: str) -> None:
        _set_name(self, name)
        _set_hash(self, hash((5, name)))
        _set_size(self, 1)

    def fields(self) -> tuple[object, ...]:
        return (self.name,)


_set_name = slot_setter(RuleReference, "name")


class Except(Node):
    """The strings of ``item`` except the byte strings of ``excluded`` (exact set difference).

    "Any key but the declared names" of an open object: built natively as the product of
    ``item``'s DFA with the names' trie (``native/thompson.hpp``), one NFA state per trie node
    reached. Built in Python as a trie of IR nodes (two per trie node) it was a third of a
    median MaskBench schema's schema-to-IR step and of its flattening. ``item`` may not call
    a rule (an inlined reference is fine). ``excluded`` is kept sorted and without repeats.
    """

    __slots__ = ("excluded", "item")
    field_names = ("item", "excluded")
    item: Node
    excluded: tuple[bytes, ...]

    def __init__(self, item: Node, excluded: tuple[bytes, ...]) -> None:
        names = tuple(sorted(set(excluded)))
        _set_except_item(self, item)
        _set_excluded(self, names)
        _set_hash(self, hash((6, item, names)))
        # The product has at most one state per trie node beside item's own.
        _set_size(self, item._size + sum(len(name) for name in names))

    def fields(self) -> tuple[object, ...]:
        return (self.item, self.excluded)

    def children(self) -> tuple[Node, ...]:
        return (self.item,)


_set_except_item = slot_setter(Except, "item")
_set_excluded = slot_setter(Except, "excluded")


class Minimized(Node):
    """The language of ``item``, built as its minimal DFA (``native/thompson.hpp``): for the
    regular leaves of a schema (patterns, formats, numbers), whose subset construction leaves
    states with equal futures apart ("a" and "a-a" under ``^[a-z]+(?:-+[a-z]+)*$``). The lazy
    automaton is not minimised as a whole: each such state was one more walk of the
    vocabulary. An item whose DFA is large (over 4,096 states), or that calls a rule, is
    built as it stands. Transparent everywhere else (the Python builder reads ``item``).
    """

    __slots__ = ("item",)
    field_names = ("item",)
    item: Node

    def __init__(self, item: Node) -> None:
        _set_minimized_item(self, item)
        _set_hash(self, hash((7, item)))
        _set_size(self, item._size)

    def fields(self) -> tuple[object, ...]:
        return (self.item,)

    def children(self) -> tuple[Node, ...]:
        return (self.item,)


_set_minimized_item = slot_setter(Minimized, "item")


EMPTY = Literal(b"")


def optional(node: Node) -> Node:
    """``node?``: zero or one time."""
    return Repeat(node, 0, 1)


def walk(node: Node) -> Iterator[Node]:
    """Each distinct node under ``node`` once, depth first. Iterative (deep trees do not hit
    the recursion limit), and a subtree shared by several parents is visited once (by
    identity), so the cost is O(distinct nodes), not O(tree)."""
    pending = [node]
    seen: set[int] = set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        pending.extend(current.children())


def expanded_size(node: Node) -> int:
    """About how many automaton states ``node`` unrolls to: a bounded repetition counts its
    item once per allowed repetition (``{0,255}`` of a character is 255 characters), a
    shared subtree once per use, a reference once. Costs O(1): computed at construction."""
    return node._size


KIND_BYTE_SET, KIND_LITERAL, KIND_SEQUENCE, KIND_CHOICE = 0, 1, 2, 3
KIND_REPEAT, KIND_REFERENCE, KIND_EXCEPT, KIND_MINIMIZED = 4, 5, 6, 7


@dataclass(frozen=True, eq=False)
class FlatGrammar:
    """A grammar's IR as arrays, one entry per distinct node value, children before parents: what
    the native automaton build reads (``native/thompson.hpp``) and the fingerprint hashes.

    ``kind`` (int8) says what ``a``, ``b``, ``c`` (int32) hold: a byte set's ranges
    ``[a, b)`` of ``range_pairs``; a literal's bytes ``[a, b)`` of ``data``; a sequence's or
    choice's children ``[a, b)`` of ``children``; a repeat's item ``a``, minimum ``b`` and
    maximum ``c`` (-1: unbounded); a reference's rule ``a`` (an index into ``rule_names``,
    sorted); an :class:`Except`'s item ``a`` and its excluded strings, ``[b, c)`` of
    ``children`` as (begin, end) pairs into ``data``; a :class:`Minimized`'s item ``a``.
    ``rule_root`` and ``roots`` give each rule's body node.
    """

    kind: np.ndarray
    a: np.ndarray
    b: np.ndarray
    c: np.ndarray
    children: np.ndarray
    data: np.ndarray
    range_pairs: np.ndarray
    rule_names: list[str]
    rule_root: np.ndarray
    roots: dict[str, int]

    def arrays(
        self,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The node arrays in the kernel's argument order: kind, a, b, c, children, data,
        range_pairs."""
        return (self.kind, self.a, self.b, self.c, self.children, self.data, self.range_pairs)


def flatten(rules: dict[str, Node]) -> FlatGrammar:
    """Number the distinct nodes of ``rules`` (equal subtrees once, by value: the schema
    compiler builds equal subtrees as distinct objects, and one flat node is one piece of
    automaton that the NFA build can share), children first, into a :class:`FlatGrammar`, in
    the native kernel (``flatten_rules``; the Python loop, now
    ``tests/grammar/flatten_reference.py``, was 30% of a small schema's compile).

    Raises:
        GrammarError: a reference names a rule that is not defined.
    Costs O(node objects), about 0.2 µs each (MaskBench's largest grammars hold 2,000-3,600).
    """
    names = sorted(rules)
    rule_number = {name: index for index, name in enumerate(names)}
    try:
        kind, a, b, c, children, data, ranges, roots = flatten_rules(
            [rules[name] for name in names], rule_number, NODE_CLASSES
        )
    except KeyError as error:
        missing = error.args[0]
        referring = next(
            name
            for name in names
            if any(isinstance(n, RuleReference) and n.name == missing for n in walk(rules[name]))
        )
        raise GrammarError(f"rule {referring!r} references undefined rule {missing!r}") from None
    except TypeError as error:
        raise GrammarError(str(error)) from None
    return FlatGrammar(
        kind=np.frombuffer(kind, dtype=np.int8),
        a=np.frombuffer(a, dtype=np.int32),
        b=np.frombuffer(b, dtype=np.int32),
        c=np.frombuffer(c, dtype=np.int32),
        children=np.frombuffer(children, dtype=np.int32),
        data=np.frombuffer(data, dtype=np.uint8),
        range_pairs=np.frombuffer(ranges, dtype=np.int32),
        rule_names=names,
        rule_root=np.array(roots, dtype=np.int32),
        roots=dict(zip(names, roots, strict=True)),
    )


NODE_CLASSES = (ByteSet, Literal, Sequence, Choice, Repeat, RuleReference, Except, Minimized)


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
        # Flattening checks every reference, and the build and the fingerprint read it.
        object.__setattr__(self, "_flat", flatten(self.rules))
        unknown = sorted(self.called_rules - self.rules.keys())
        if unknown:
            raise GrammarError(f"called rules {unknown} are not defined")

    def flat(self) -> FlatGrammar:
        """The rules as arrays (computed once, at construction)."""
        return self._flat  # type: ignore[attr-defined]

    def fingerprint(self) -> str:
        """A stable hash of the rules (the cache key of compiled grammars): SHA-256 of the
        flattened arrays. Costs O(distinct nodes) in hashing, about 20 µs for a schema."""
        flat = self.flat()
        digest = hashlib.sha256()
        digest.update(self.start.encode() + b"\x00")
        for name in flat.rule_names:
            digest.update(name.encode() + b"\x01" + str(flat.roots[name]).encode() + b"\x00")
        for array in flat.arrays():
            digest.update(str(len(array)).encode() + b"\x03" + array.tobytes())
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
