"""Structural tags as grammar: free text up to a trigger, then tagged bodies.

A chat model that knows a tool-call syntax (``<tool_call>{...}</tool_call>`` in Qwen and
Hermes templates) writes text, then perhaps a call. :func:`tagged_grammar` is that output
as one context-free grammar: text that never contains the trigger, then optionally one or
more ``open body close`` regions, where ``body`` is another grammar (a call's JSON
schema). The mask is then loose in the text (every token but those that would complete the
trigger wrongly) and exact inside a tag, and the one decoding loop, its forced tokens
(after the trigger, ``{"name": "`` is forced), rollback and closing within a budget work
unchanged: nothing here is a second matcher.

The text part is a regular language built by :func:`text_without`; it is byte-level (a
token may end inside a UTF-8 character), as the model's free text is.
"""

from __future__ import annotations

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
    optional,
)

TAGGED_START = "formline_tagged"


def _bytes_except(*excluded: int) -> ByteSet:
    ranges, low = [], 0
    for byte in sorted(set(excluded)):
        if byte > low:
            ranges.append((low, byte - 1))
        low = byte + 1
    if low <= 255:
        ranges.append((low, 255))
    return ByteSet(tuple(ranges))


def text_without(trigger: bytes) -> Node:
    """Every byte string that does not contain ``trigger``.

    With ``a`` the trigger's first byte and ``rest`` the others, a string without the
    trigger is a run of pieces, each a byte other than ``a`` or an ``a`` followed by
    partial prefixes that restart on ``a`` (``(P a)*``, ``P`` a proper prefix of ``rest``)
    and then break off (``S``: a prefix of ``rest`` then a byte that neither continues nor
    restarts), and it may end inside a partial trigger: ``([^a] | a (P a)* S)* (a (P a)* P)?``.
    Linear in the trigger's length.

    Raises:
        GrammarError: ``trigger`` is empty, or its first byte occurs in it again (then a
            failed match can restart part-way, which this construction does not follow).
    """
    if not trigger:
        raise GrammarError("a tag's trigger must not be empty")
    first, rest = trigger[0], trigger[1:]
    if first in rest:
        raise GrammarError(f"a tag's trigger {trigger!r} must not repeat its first byte")
    if not rest:
        return Repeat(_bytes_except(first), 0, None)
    opening = Literal(bytes([first]))
    prefixes = [Literal(rest[:length]) if length else EMPTY for length in range(len(rest))]
    partial = Choice(tuple(prefixes))
    breaks = Choice(
        tuple(
            Sequence((prefix, _bytes_except(rest[length], first)))
            for length, prefix in enumerate(prefixes)
        )
    )
    restarts = Repeat(Sequence((partial, opening)), 0, None)
    piece = Choice((_bytes_except(first), Sequence((opening, restarts, breaks))))
    return Sequence((Repeat(piece, 0, None), optional(Sequence((opening, restarts, partial)))))


def tagged_grammar(
    body: Grammar,
    trigger: bytes,
    opening: bytes,
    closing: bytes,
    *,
    text_first: bool,
    max_tags: int = 1,
    separator: bytes = b"\n",
) -> Grammar:
    """``opening body closing`` 1 to ``max_tags`` times (``separator`` between), after free
    text without ``trigger`` when ``text_first`` (then the tags are optional: text alone is
    an answer). ``opening`` must start with ``trigger``.

    Raises:
        GrammarError: a bad trigger (see :func:`text_without`), ``opening`` not starting
            with it, ``max_tags`` below 1, or a rule name taken by ``body``.
    Costs a few IR nodes; the body's rules are reused as they are.
    """
    if not opening.startswith(trigger):
        raise GrammarError(f"a tag's opening {opening!r} must start with its trigger {trigger!r}")
    if max_tags < 1:
        raise GrammarError("a tagged grammar needs at least one tag")
    if TAGGED_START in body.rules:
        raise GrammarError(f"the body grammar already has a rule named {TAGGED_START!r}")
    tag = Sequence((Literal(opening), RuleReference(body.start), Literal(closing)))
    tags: Node = tag
    if max_tags > 1:
        tags = Sequence((tag, Repeat(Sequence((Literal(separator), tag)), 0, max_tags - 1)))
    root = Sequence((text_without(trigger), optional(tags))) if text_first else tags
    rules = {**body.rules, TAGGED_START: root}
    # Several tags would copy the body into the root once per tag; one called rule is one DFA.
    called = body.called_rules | ({body.start} if max_tags > 1 else set())
    return Grammar(rules, TAGGED_START, called_rules=frozenset(called))
