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
from dataclasses import dataclass

import numpy as np

from formline.grammar.nodes import (
    EMPTY,
    ByteSet,
    Choice,
    Except,
    GrammarError,
    Literal,
    Minimized,
    Node,
    Repeat,
    RuleReference,
    Sequence,
    expanded_size,
    optional,
    require_utf8,
    walk,
)
from formline.native import flatten_rules

# The nodes are defined in formline.grammar.nodes and named here too, where the grammar is.
__all__ = [
    "EMPTY",
    "KIND_BYTE_SET",
    "KIND_CHOICE",
    "KIND_EXCEPT",
    "KIND_LITERAL",
    "KIND_MINIMIZED",
    "KIND_REFERENCE",
    "KIND_REPEAT",
    "KIND_SEQUENCE",
    "NODE_CLASSES",
    "ByteSet",
    "Choice",
    "Except",
    "FlatGrammar",
    "Grammar",
    "GrammarError",
    "Literal",
    "Minimized",
    "Node",
    "Repeat",
    "RuleReference",
    "Sequence",
    "expanded_size",
    "flatten",
    "optional",
    "unflatten",
    "walk",
]

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

    def memory_bytes(self) -> int:
        """The bytes of the arrays and about those of the rule names. Costs O(rules)."""
        names = sum(64 + len(name) for name in self.rule_names)
        return sum(array.nbytes for array in self.arrays()) + self.rule_root.nbytes + names


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


def unflatten(flat: FlatGrammar) -> dict[str, Node]:
    """The rules of ``flat`` as nodes again, equal by value to the ones flattened (a node
    that was several equal objects is now one, shared). Rules come in name order.
    Costs O(distinct nodes), about 0.6 µs each (meltano.schema's 1,561: 0.95 ms)."""
    kinds, firsts, seconds, thirds, children, pairs = (
        array.tolist()
        for array in (flat.kind, flat.a, flat.b, flat.c, flat.children, flat.range_pairs)
    )
    data = flat.data.tobytes()
    nodes: list[Node] = []
    for kind, first, second, third in zip(kinds, firsts, seconds, thirds, strict=True):
        node: Node
        if kind == KIND_SEQUENCE:
            node = Sequence(tuple([nodes[child] for child in children[first:second]]))
        elif kind == KIND_CHOICE:
            node = Choice(tuple([nodes[child] for child in children[first:second]]))
        elif kind == KIND_LITERAL:
            node = Literal(data[first:second])
        elif kind == KIND_BYTE_SET:
            lows, highs = pairs[2 * first : 2 * second : 2], pairs[2 * first + 1 : 2 * second : 2]
            node = ByteSet(tuple(zip(lows, highs, strict=True)))
        elif kind == KIND_REPEAT:
            node = Repeat(nodes[first], second, None if third < 0 else third)
        elif kind == KIND_REFERENCE:
            node = RuleReference(flat.rule_names[first])
        elif kind == KIND_EXCEPT:
            bounds = children[second:third]
            excluded = tuple(
                data[begin:end] for begin, end in zip(bounds[::2], bounds[1::2], strict=True)
            )
            node = Except(nodes[first], excluded)
        elif kind == KIND_MINIMIZED:
            node = Minimized(nodes[first])
        else:
            raise GrammarError(f"unknown flat node kind {kind}")
        nodes.append(node)
    return {name: nodes[flat.roots[name]] for name in flat.rule_names}


def _set_grammar(
    grammar: Grammar,
    rules: dict[str, Node] | None,
    flat: FlatGrammar,
    sizes: dict[str, int],
    fingerprint: str | None,
    start: str,
    source: str,
    called_rules: frozenset[str],
) -> None:
    """A grammar's fields (it refuses assignment otherwise)."""
    for name, value in (
        ("_rules", rules), ("_flat", flat), ("_rule_sizes", sizes), ("_fingerprint", fingerprint),
        ("start", start), ("source", source), ("called_rules", called_rules),
    ):  # fmt: skip
        object.__setattr__(grammar, name, value)


class Grammar:
    """A context-free grammar over bytes: named rules and a start rule.

    Build one with :meth:`from_regex`, :meth:`from_choices`, :meth:`from_ebnf` or
    :meth:`from_gbnf`. Construction validates that every referenced rule exists. Immutable;
    equal when the rules, start and called rules are (by value: their fingerprints).

    A grammar kept for long (the compiler's cache) is kept :meth:`compact`: its flattened
    arrays only, the rules' node objects rebuilt the first time :attr:`rules` is read. Every
    node is an object the garbage collector scans: with the 300 MaskBench schemas' grammars
    cached, 68,442 nodes and the 38,003 tuples of their children were 78% of the 137,081
    objects a full collection walked.

    Raises:
        GrammarError: the start rule or a referenced rule is missing.
    """

    __slots__ = (
        "__weakref__",
        "_fingerprint",
        "_flat",
        "_rule_sizes",
        "_rules",
        "called_rules",
        "source",
        "start",
    )
    _rules: dict[str, Node] | None
    _flat: FlatGrammar
    _rule_sizes: dict[str, int]
    _fingerprint: str | None
    start: str
    source: str
    # Rules entered through call edges even when they are not recursive. Inlining copies a
    # rule into every caller, so a sub-grammar referenced from n places (or a chain of rules
    # that each reference the next two) costs n copies; a called rule costs one DFA.
    called_rules: frozenset[str]

    def __init__(
        self,
        rules: dict[str, Node],
        start: str = "root",
        source: str = "",
        called_rules: frozenset[str] = frozenset(),
    ) -> None:
        if start not in rules:
            raise GrammarError(f"start rule {start!r} is not defined")
        # Flattening checks every reference, and the build and the fingerprint read it.
        flat = flatten(rules)
        unknown = sorted(called_rules - rules.keys())
        if unknown:
            raise GrammarError(f"called rules {unknown} are not defined")
        sizes = {name: node._size for name, node in rules.items()}
        _set_grammar(self, rules, flat, sizes, None, start, source, frozenset(called_rules))

    @property
    def rules(self) -> dict[str, Node]:
        """The rules' bodies by name (a compact grammar's are rebuilt from its arrays at the
        first read: O(distinct nodes), about 0.6 µs each)."""
        rules = self._rules
        if rules is None:  # two threads may both rebuild: equal values, either one kept
            rules = unflatten(self._flat)
            object.__setattr__(self, "_rules", rules)
        return rules

    def compact(self) -> Grammar:
        """This grammar without its node objects (they are rebuilt when :attr:`rules` is
        read), with its fingerprint: what the compiler's cache keeps. Shares the arrays;
        costs the fingerprint the first time it is asked (about 20 µs for a schema), O(1)
        after."""
        twin = type(self).__new__(type(self))
        fingerprint = self.fingerprint()
        _set_grammar(
            twin, None, self._flat, self._rule_sizes, fingerprint, self.start, self.source,
            self.called_rules,
        )  # fmt: skip
        return twin

    def memory_bytes(self) -> int:
        """About the bytes a compact grammar holds: its arrays (:meth:`FlatGrammar.
        memory_bytes`; the nodes of one whose rules were read are not counted)."""
        return self._flat.memory_bytes()

    def rule_size(self, name: str) -> int:
        """:func:`expanded_size` of rule ``name``'s body, without its nodes. Raises
        ``KeyError`` for an unknown rule. Costs O(1)."""
        return self._rule_sizes[name]

    def flat(self) -> FlatGrammar:
        """The rules as arrays (computed once, at construction)."""
        return self._flat

    def fingerprint(self) -> str:
        """A stable hash of the rules (the cache key of compiled grammars): SHA-256 of the
        flattened arrays. Costs O(distinct nodes) in hashing the first time, about 20 µs for
        a schema; then it is kept."""
        if self._fingerprint is not None:
            return self._fingerprint
        flat = self.flat()
        digest = hashlib.sha256()
        digest.update(self.start.encode() + b"\x00")
        for name in flat.rule_names:
            digest.update(name.encode() + b"\x01" + str(flat.roots[name]).encode() + b"\x00")
        for array in flat.arrays():
            digest.update(str(len(array)).encode() + b"\x03" + array.tobytes())
        for name in sorted(self.called_rules):
            digest.update(b"\x02" + name.encode())
        found = digest.hexdigest()
        object.__setattr__(self, "_fingerprint", found)
        return found

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Grammar):
            return NotImplemented
        return self is other or self.fingerprint() == other.fingerprint()

    def __hash__(self) -> int:
        return hash(self.fingerprint())

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"grammars are immutable: cannot assign {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"grammars are immutable: cannot delete {name!r}")

    def __repr__(self) -> str:
        return (
            f"Grammar(rules={self.rules!r}, start={self.start!r}, source={self.source!r}, "
            f"called_rules={self.called_rules!r})"
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.rules, self.start, self.source, self.called_rules))

    @classmethod
    def from_regex(cls, pattern: str) -> Grammar:
        """A grammar for strings that fully match ``pattern`` (see :mod:`.regex`).

        Raises:
            TypeError: ``pattern`` is not a ``str`` (bytes raised a bare AttributeError).
            GrammarError: as :func:`~formline.grammar.regex.parse_regex`.
        """
        from formline.grammar.regex import parse_regex

        _require_text(pattern, "a regex")
        return cls({"root": parse_regex(pattern)}, "root", source=pattern)

    @classmethod
    def from_choices(cls, choices: list[str] | tuple[str, ...]) -> Grammar:
        """A grammar for exactly one of ``choices``.

        Raises:
            TypeError: ``choices`` is one string (it was read as its characters) or holds
                something else than strings.
            GrammarError: the list is empty, or a choice is not text (a lone surrogate).
        """
        if isinstance(choices, str | bytes) or not all(isinstance(c, str) for c in choices):
            raise TypeError("choices must be a list of strings, not one string or other values")
        if not choices:
            raise GrammarError("a choice grammar needs at least one choice")
        for index, choice in enumerate(choices):  # the index: the position is the choice's
            require_utf8(choice, f"choice {index}")
        options = tuple(Literal(choice.encode("utf-8")) for choice in dict.fromkeys(choices))
        return cls({"root": Choice(options)}, "root")

    @classmethod
    def from_ebnf(cls, text: str, start: str = "root") -> Grammar:
        """A grammar from formline's EBNF text (GBNF plus ``/regex/`` terminals).

        Raises:
            TypeError: ``text`` is not a ``str``.
            GrammarError: malformed text, with its line and column.
        """
        from formline.grammar.ebnf import parse_ebnf

        _require_text(text, "an EBNF grammar")
        return cls(parse_ebnf(text), start, source=text)

    @classmethod
    def from_gbnf(cls, text: str) -> Grammar:
        """A grammar from a llama.cpp GBNF text (start rule ``root``).

        Raises:
            TypeError: ``text`` is not a ``str``.
            GrammarError: malformed text, with its line and column.
        """
        from formline.grammar.ebnf import parse_ebnf

        _require_text(text, "a GBNF grammar")
        return cls(parse_ebnf(text, allow_regex=False), "root", source=text)


def _require_text(value: object, what: str) -> None:
    """Raise TypeError unless ``value`` is a ``str`` (``what`` names it)."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
