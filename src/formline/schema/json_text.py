"""The JSON text around the values: whitespace, literals, strings, and the "any value" rules.

Serialisation is compact (``{"a":1,"b":[2,3]}``) by default; ``whitespace=N`` allows at most
N bytes of space, tab or newline between tokens, never an unbounded run: small models that
may emit whitespace freely loop on it until ``max_tokens``, the failure peers' users report
most (23% of calls in one report, see shared field notes).

Strings follow Python's ``json.dumps(value, ensure_ascii=False)`` encoding, the canonical
one: raw UTF-8 except ``\\"``, ``\\\\`` and control characters (short escapes or ``\\u00xx``).
A canonical encoding is unique per string, so "any key except these names" is exact.
"""

from __future__ import annotations

import json
from functools import cache
from json.encoder import encode_basestring
from typing import Any

from formline.grammar.ir import (
    EMPTY,
    ByteSet,
    Choice,
    Except,
    Literal,
    Minimized,
    Node,
    Repeat,
    RuleReference,
    Sequence,
)
from formline.schema.numbers import number_node
from formline.schema.patterns import length_node

NOTHING = Choice(())  # matches no string: a false schema, an empty enum
QUOTE = Literal(b'"')
ANY_VALUE_RULE = "json_value"


def compact_json(value: Any) -> bytes:
    """The compact, canonical JSON text of ``value`` (what the grammar produces for it).

    A lone surrogate (``"\\ud800"``, valid JSON, not encodable as UTF-8) is written as its
    ``\\uXXXX`` escape, which ``backslashreplace`` spells exactly; the text parses back to
    the same value. Costs 0.05 µs for a string (json.dumps' own encoder, without the 0.65 µs
    of making a ``JSONEncoder`` per call: a schema compile spells 49 names on average)."""
    if type(value) is str:
        text = encode_basestring(value)  # what json.dumps(ensure_ascii=False) calls for a str
    else:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8", "backslashreplace")


def is_json_number(value: Any) -> bool:
    """Whether ``value`` is a JSON number (not a boolean)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def number_spellings(value: int | float) -> list[bytes]:
    """The compact texts of the values equal to ``value`` under JSON Schema: 1 and 1.0 are
    one value, so is 1e20 and 100000000000000000000 (an enum of 1e20 refused the integer;
    a const ``[1.0]`` refused ``[1]``). A spelling is added only where it is exactly equal:
    ``10**20 + 1`` is not ``1e+20``. Costs O(digits)."""
    texts = [compact_json(value)]
    if isinstance(value, float) and value.is_integer():
        texts.append(compact_json(int(value)))
    elif isinstance(value, int):
        try:
            as_float = float(value)
        except OverflowError:  # past 1.8e308: no float spells it
            as_float = None
        if as_float is not None and as_float == value:
            texts.append(compact_json(as_float))
    return list(dict.fromkeys(texts))


def _has_number(value: Any) -> bool:
    """Whether a JSON value holds a number anywhere (iterative)."""
    pending = [value]
    while pending:
        current = pending.pop()
        if is_json_number(current):
            return True
        if isinstance(current, dict):
            pending.extend(current.values())
        elif isinstance(current, list):
            pending.extend(current)
    return False


def is_nothing(node: Node) -> bool:
    """Whether ``node`` is the node that matches nothing."""
    return type(node) is Choice and not node.options


# sequence() and choice() build most of a schema's IR (about 500 calls for a median
# MaskBench schema): the tests are inline type checks, not calls (5.3 -> 1.3 µs a sequence).
def sequence(*items: Node) -> Node:
    """A sequence without empty literals; one item stays itself; any NOTHING gives NOTHING."""
    kept = []
    for item in items:
        kind = type(item)
        if kind is Literal:
            if not item.value:  # type: ignore[attr-defined]
                continue
        elif kind is Choice and not item.options:  # type: ignore[attr-defined]
            return NOTHING
        kept.append(item)
    if not kept:
        return EMPTY
    return kept[0] if len(kept) == 1 else Sequence(tuple(kept))


def choice(options: list[Node]) -> Node:
    """An alternation without NOTHING options and without duplicates (the first of equal
    options stays). A dictionary filled in a loop, not made from a generator: a choice of
    two took 0.40 µs compiled, 0.23 now (choice() was 3-4% of the slowest schemas'
    schema-to-IR)."""
    kept: dict[Node, None] = {}
    for option in options:
        if type(option) is not Choice or option.options:
            kept[option] = None
    if not kept:
        return NOTHING
    if len(kept) == 1:
        return next(iter(kept))
    return Choice(tuple(kept))


def minimized(node: Node) -> Node:
    """``node`` as a :class:`Minimized` piece, unless it matches nothing or is one literal or
    byte set (minimal already)."""
    if is_nothing(node) or type(node) in (Literal, ByteSet):
        return node
    return Minimized(node)


def optional(node: Node) -> Node:
    """Zero or one ``node`` (a NOTHING node leaves just the empty string)."""
    return EMPTY if is_nothing(node) else Repeat(node, 0, 1)


class JsonText:
    """Builds the punctuation and generic parts of JSON text for one whitespace setting."""

    def __init__(self, whitespace: int | None):
        if whitespace is not None and whitespace < 0:
            raise ValueError("whitespace must be None (compact) or a count >= 0")
        self.whitespace = whitespace
        self.space: Node = EMPTY
        if whitespace:
            self.space = Repeat(ByteSet(((0x09, 0x0A), (0x0D, 0x0D), (0x20, 0x20))), 0, whitespace)
        # Every member writes ":" and most a ",": made once (nodes are immutable), not per use
        # (18,570 calls in 40 compiles of four big MaskBench schemas).
        self._tokens: dict[bytes, Node] = {}

    def token(self, text: bytes) -> Node:
        """A punctuation token with the allowed whitespace after it."""
        made = self._tokens.get(text)
        if made is None:
            made = self._tokens[text] = sequence(Literal(text), self.space)
        return made

    def string(self, body: Node) -> Node:
        """A JSON string whose body (between the quotes) is ``body``."""
        return sequence(QUOTE, body, QUOTE)

    def any_string_body(self, minimum: int = 0, maximum: int | None = None) -> Node:
        """Any string body of ``minimum`` to ``maximum`` characters."""
        return length_node(minimum, maximum)

    def literal(self, value: Any) -> Node:
        """Exactly the compact text of ``value`` (with the configured whitespace inside),
        each number in every spelling JSON Schema's equality admits (see
        :func:`number_spellings`), at any depth."""
        if is_json_number(value):
            return choice([Literal(text) for text in number_spellings(value)])
        if isinstance(value, dict | list) and (self.whitespace or _has_number(value)):
            return self._spaced_literal(value)
        return Literal(compact_json(value))

    def _spaced_literal(self, value: Any) -> Node:
        """An object or array literal with whitespace where the rest of the grammar takes
        it: after every token, so also before ``:`` and ``,`` (``{"x" :[1 ,2]}`` was
        refused under ``{"const": {"x": [1, 2]}}`` and accepted under ``"type":
        "object"``)."""
        if isinstance(value, dict):
            entries = [
                sequence(
                    Literal(compact_json(key)), self.space, self.token(b":"), self.literal(item)
                )
                for key, item in value.items()
            ]
            return self._wrap(b"{", entries, b"}")
        return self._wrap(b"[", [self.literal(item) for item in value], b"]")

    def _wrap(self, opening: bytes, items: list[Node], closing: bytes) -> Node:
        parts: list[Node] = [self.token(opening)]
        for index, item in enumerate(items):
            if index:
                parts.append(sequence(self.space, self.token(b",")))
            parts.append(item)
        parts.append(sequence(self.space, Literal(closing)))
        return sequence(*parts)

    def any_value_rules(self) -> dict[str, Node]:
        """The recursive rules of an unconstrained JSON value (start ``json_value``): built
        once per whitespace setting (0.4 ms of Python each time, for most schemas)."""
        return dict(_any_value_rules(self.whitespace))

    def _build_any_value_rules(self) -> dict[str, Node]:
        value = RuleReference(ANY_VALUE_RULE)
        string = self.string(self.any_string_body())
        entry = sequence(string, self.space, self.token(b":"), value, self.space)
        members = sequence(entry, Repeat(sequence(self.token(b","), entry), 0, None))
        elements = sequence(
            value, self.space, Repeat(sequence(self.token(b","), value, self.space), 0, None)
        )
        return {
            ANY_VALUE_RULE: choice(
                [
                    sequence(self.token(b"{"), optional(members), Literal(b"}")),
                    sequence(self.token(b"["), optional(elements), Literal(b"]")),
                    string,
                    number_node(None, None),
                    Literal(b"true"),
                    Literal(b"false"),
                    Literal(b"null"),
                ]
            )
        }


@cache
def _any_value_rules(whitespace: int | None) -> dict[str, Node]:
    return JsonText(whitespace)._build_any_value_rules()


def string_body_except(names: list[str], any_body: Node) -> Node:
    """Any canonical string body except the bodies of ``names`` (exact): the language of
    ``any_body`` less the names' canonical encodings, as one :class:`Except` node that the
    automaton build reads in step with the names' trie. Canonical encodings are unique, so
    a name cannot sneak back in through an escape. Costs O(total characters of the names):
    the json encoding of each (the trie of IR nodes built here before was a third of a
    median MaskBench schema's grammar build)."""
    return Except(any_body, tuple(compact_json(name)[1:-1] for name in names))
