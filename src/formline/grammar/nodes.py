"""The grammar IR's nodes: byte sets, literals, sequences, choices, repetitions, rule
references, exclusions and minimised items (see :mod:`formline.grammar.ir` for the grammar
that holds them, and its flat form). Immutable and hashed once at construction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, cast

from formline.errors import FormlineError

try:
    import cython

    # True where this module runs compiled (Cython makes it a constant), False from source.
    IS_COMPILED: bool = cython.compiled
except ImportError:  # from source, without Cython installed
    IS_COMPILED = False


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

    Not frozen dataclasses: a dataclass's generated ``__init__`` and ``__post_init__`` made a
    three-item ``Sequence`` cost 3.0 µs, about a third of a median MaskBench schema's grammar
    construction. From source they are slotted classes. Compiled, ``nodes.pxd`` makes them C
    types whose fields are C members (read-only to Python): a three-item ``Sequence`` costs
    0.10 µs, 0.29 as a slotted class compiled by Cython, and hashing a composite's children
    calls C, not a Python ``__hash__`` per child (``python -m bench.ttfm_stages``: the
    slowest tenth's schema-to-IR step 2.41 -> 2.01 ms, means of four runs alternated with
    the slotted classes). Assigning or deleting an attribute raises
    ``AttributeError``, as a frozen dataclass does; like one, a node's ``__init__`` called
    again on it would rewrite it (nothing does).
    """

    __slots__ = ("_hash", "_size")
    # In the order of fields() and __init__. Not a ClassVar annotation: compiled, an
    # annotated class attribute of a C type draws Cython's "Annotation ignored" warning.
    field_names = cast("tuple[str, ...]", ())
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
    """The setter of slot ``name`` of ``cls``, with which a node's constructor writes its
    fields from source (compiled, they are C members written directly): not through
    ``__setattr__``, which refuses, nor ``object.__setattr__``, which looks the slot up on the
    type at every write (a Literal 0.29 -> 0.20 µs from source; 1.1 through a Python
    ``__setattr__`` that lets the constructor through)."""
    setter: Callable[[Any, Any], None] = cls.__dict__[name].__set__
    return setter


_set_hash = slot_setter(Node, "_hash")
_set_size = slot_setter(Node, "_size")


def _total_size(children: tuple[Node, ...]) -> int:
    """A sequence's or choice's expanded size: its children's, at least 1. The children's
    sizes (and hashes) are cached already, so a node costs O(children), not O(subtree): the
    schema compiler asks :func:`expanded_size` of every member and array item (5,946 tree
    walks were 15% of 60 MaskBench compiles)."""
    size = 0
    for child in children:
        size += child._size
    return size or 1


class ByteSet(Node):
    """One byte from a union of inclusive ranges, e.g. ``((0x30, 0x39),)`` for a digit."""

    __slots__ = ("ranges",)
    field_names = ("ranges",)
    ranges: tuple[tuple[int, int], ...]

    def __init__(self, ranges: tuple[tuple[int, int], ...]) -> None:
        for low, high in ranges:
            if not 0 <= low <= high <= 255:
                raise GrammarError(f"invalid byte range {low}-{high}")
        digest = hash((0, ranges))
        if IS_COMPILED:
            self.ranges = ranges
            self._size = 1
            self._hash = digest
        else:
            _set_ranges(self, ranges)
            _set_size(self, 1)
            _set_hash(self, digest)

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
        size, digest = len(value) or 1, hash((1, value))
        if IS_COMPILED:
            self.value = value
            self._size = size
            self._hash = digest
        else:
            _set_value(self, value)
            _set_size(self, size)
            _set_hash(self, digest)

    def fields(self) -> tuple[object, ...]:
        return (self.value,)


_set_value = slot_setter(Literal, "value")


class Sequence(Node):
    """Items one after another."""

    __slots__ = ("items",)
    field_names = ("items",)
    items: tuple[Node, ...]

    def __init__(self, items: tuple[Node, ...]) -> None:
        size, digest = _total_size(items), hash((2, items))
        if IS_COMPILED:
            self.items = items
            self._size = size
            self._hash = digest
        else:
            _set_items(self, items)
            _set_size(self, size)
            _set_hash(self, digest)

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
        size, digest = _total_size(options), hash((3, options))
        if IS_COMPILED:
            self.options = options
            self._size = size
            self._hash = digest
        else:
            _set_options(self, options)
            _set_size(self, size)
            _set_hash(self, digest)

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
        size = item._size * max(maximum or minimum, 1)
        digest = hash((4, item, minimum, maximum))
        if IS_COMPILED:
            self.item = item
            self.minimum = minimum
            self.maximum = maximum
            self._size = size
            self._hash = digest
        else:
            _set_repeat_item(self, item)
            _set_minimum(self, minimum)
            _set_maximum(self, maximum)
            _set_size(self, size)
            _set_hash(self, digest)

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
        digest = hash((5, name))
        if IS_COMPILED:
            self.name = name
            self._size = 1
            self._hash = digest
        else:
            _set_name(self, name)
            _set_size(self, 1)
            _set_hash(self, digest)

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
        # The product has at most one state per trie node beside item's own.
        size = item._size + sum(len(name) for name in names)
        digest = hash((6, item, names))
        if IS_COMPILED:
            self.item = item
            self.excluded = names
            self._size = size
            self._hash = digest
        else:
            _set_except_item(self, item)
            _set_excluded(self, names)
            _set_size(self, size)
            _set_hash(self, digest)

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
        digest = hash((7, item))
        if IS_COMPILED:
            self.item = item
            self._size = item._size
            self._hash = digest
        else:
            _set_minimized_item(self, item)
            _set_size(self, item._size)
            _set_hash(self, digest)

    def fields(self) -> tuple[object, ...]:
        return (self.item,)

    def children(self) -> tuple[Node, ...]:
        return (self.item,)


_set_minimized_item = slot_setter(Minimized, "item")


EMPTY = Literal(b"")


def optional(node: Node) -> Node:
    """``node?``: zero or one time."""
    return Repeat(node, 0, 1)


def repeat(item: Node, minimum: int, maximum: int | None) -> Node:
    """``item{minimum,maximum}``, where an optional or starred ``item``'s copies are merged:
    ``(y?){m,n}`` is ``y{0,n}`` and ``(y*){m,n}`` is ``y*`` (n at least 1), the same
    language. Each copy of a nullable item is crossed without a byte, so a DFA state of
    ``(a?){100000}`` held all 100,000 copies: 3,000 bytes took 36 s and 2.4 GB to walk.

    Raises:
        GrammarError: ``maximum`` below ``minimum``, or a negative bound."""
    if isinstance(item, Repeat) and item.minimum == 0 and (maximum is None or maximum >= 1):
        if maximum is not None and maximum < minimum:
            raise GrammarError(f"invalid repetition bounds {{{minimum},{maximum}}}")
        if item.maximum == 1:
            return Repeat(item.item, 0, maximum)
        if item.maximum is None:
            return item
    return Repeat(item, minimum, maximum)


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


def require_utf8(text: str, what: str) -> None:
    """Raise unless ``text`` encodes as UTF-8 (a lone surrogate such as ``"\\ud800"``, which a
    JSON request may hold, does not: it raised UnicodeEncodeError deep in a parser).

    Raises:
        GrammarError: naming ``what`` and the character's position.
    Costs one encode of ``text``.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        code = ord(text[error.start])
        raise GrammarError(
            f"{what}: U+{code:04X} is a lone surrogate, not text", error.start, text
        ) from None
