"""Thompson construction: grammar IR to a byte-level NFA with call edges.

Besides byte-range and epsilon edges, an NFA here has *call edges* labelled with a rule name:
they stand for "match the whole rule here", and are how recursive rules stay finite. The
caller (``formline.parser.pushdown``) decides which references become call edges (rules in a
recursion cycle) and which are inlined (everything else), through ``is_call``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from formline.grammar.budget import (
    CHECK_EVERY_STATES,
    DEFAULT_NFA_STATE_LIMIT,
    CompileLimitError,
    Deadline,
    no_deadline,
)
from formline.grammar.ir import (
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
)

ExceptPair = tuple[frozenset[int], int | None]  # (item states, trie node or None: left)


class AutomatonLimitError(CompileLimitError):
    """An automaton would exceed its configured state limit (a blow-up, reported not hung)."""


@dataclass
class Nfa:
    """A mutable NFA. States are ints; ``start`` and ``accept`` are set by :func:`build_nfa`."""

    state_limit: int = DEFAULT_NFA_STATE_LIMIT
    deadline: Deadline = field(default_factory=no_deadline)
    byte_edges: list[list[tuple[tuple[tuple[int, int], ...], int]]] = field(default_factory=list)
    epsilon_edges: list[list[int]] = field(default_factory=list)
    call_edges: list[list[tuple[str, int]]] = field(default_factory=list)
    start: int = 0
    accept: int = 0

    def new_state(self) -> int:
        count = len(self.byte_edges)
        if count >= self.state_limit:
            raise AutomatonLimitError(
                f"the grammar needs more than {self.state_limit} NFA states "
                "(large repetition counts or a very large grammar); raise the limit or simplify",
                "nfa_states",
                self.state_limit,
            )
        if count % CHECK_EVERY_STATES == 0:
            self.deadline.check(f"building an automaton ({count} NFA states so far)")
        self.byte_edges.append([])
        self.epsilon_edges.append([])
        self.call_edges.append([])
        return len(self.byte_edges) - 1

    @property
    def size(self) -> int:
        return len(self.byte_edges)


def build_nfa(
    body: Node,
    resolve: Callable[[str], Node],
    is_call: Callable[[str], bool],
    state_limit: int = DEFAULT_NFA_STATE_LIMIT,
    deadline: Deadline | None = None,
) -> Nfa:
    """Build the NFA of ``body``; references are inlined via ``resolve`` unless ``is_call``.

    Raises:
        AutomatonLimitError: more than ``state_limit`` states would be needed.
        CompileLimitError: ``deadline`` passed while building.
    Costs O(size of the expanded tree), bounded by ``state_limit``.
    """
    # The unrolled size is known before anything is built: (a{1000}){1000} used to build
    # 500,000 states (4 s) before the limit stopped it. References count once here; an
    # inlined rule's share is still bounded by the state counter below.
    estimate = expanded_size(body)
    if estimate > state_limit:
        raise AutomatonLimitError(
            f"the grammar needs about {estimate:,} NFA states, more than the limit of "
            f"{state_limit:,} (large repetition counts or a very large grammar); simplify it "
            "or give the compile a larger budget",
            "nfa_states",
            state_limit,
        )
    nfa = Nfa(state_limit=state_limit, deadline=deadline or no_deadline())
    nfa.start = nfa.new_state()
    nfa.accept = nfa.new_state()
    builder = _Builder(nfa, resolve, is_call)
    previous_limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(previous_limit, 20_000))
    try:
        builder.build(body, nfa.start, nfa.accept)
    except RecursionError:
        raise GrammarError("the grammar is nested too deeply to compile") from None
    finally:
        sys.setrecursionlimit(previous_limit)
    return nfa


class _Builder:
    def __init__(self, nfa: Nfa, resolve: Callable[[str], Node], is_call: Callable[[str], bool]):
        self.nfa = nfa
        self.resolve = resolve
        self.is_call = is_call

    def build(self, node: Node, start: int, end: int) -> None:
        """Add states and edges so that paths start→end spell exactly ``node``'s language."""
        nfa = self.nfa
        if isinstance(node, ByteSet):
            if node.ranges:
                nfa.byte_edges[start].append((node.ranges, end))
        elif isinstance(node, Literal):
            self.build_literal(node.value, start, end)
        elif isinstance(node, Sequence):
            current = start
            for index, item in enumerate(node.items):
                following = end if index == len(node.items) - 1 else nfa.new_state()
                self.build(item, current, following)
                current = following
            if not node.items:
                nfa.epsilon_edges[start].append(end)
        elif isinstance(node, Choice):
            for option in node.options:
                self.build(option, start, end)
        elif isinstance(node, Repeat):
            self.build_repeat(node, start, end)
        elif isinstance(node, Except):
            self.build_except(node, start, end)
        elif isinstance(node, Minimized):
            self.build(node.item, start, end)  # the same language; only the kernel minimises
        elif isinstance(node, RuleReference):
            if self.is_call(node.name):
                nfa.call_edges[start].append((node.name, end))
            else:
                self.build(self.resolve(node.name), start, end)
        else:  # pragma: no cover - every IR node type is handled above
            raise GrammarError(f"unknown grammar node {type(node).__name__}")

    def build_except(self, node: Except, start: int, end: int) -> None:
        """The item's NFA read in step with the excluded strings' trie: one state per (item
        state set, trie node) pair met, the subset construction done on the way (the native
        build determinises the item first; this is its reference). Costs 256 byte steps per
        pair.

        Raises:
            GrammarError: the item calls a rule.
        """
        item = Nfa(state_limit=self.nfa.state_limit, deadline=self.nfa.deadline)
        item.start, item.accept = item.new_state(), item.new_state()
        _Builder(item, self.resolve, self.is_call).build(node.item, item.start, item.accept)
        if any(item.call_edges):
            raise GrammarError("the item of an Except node calls a rule")
        children: list[dict[int, int]] = [{}]
        ends: set[int] = set()
        for name in node.excluded:
            trie_at = 0
            for byte in name:
                if byte not in children[trie_at]:
                    children[trie_at][byte] = len(children)
                    children.append({})
                trie_at = children[trie_at][byte]
            ends.add(trie_at)
        first: ExceptPair = (epsilon_closure(item, {item.start}), 0)
        state_of: dict[ExceptPair, int] = {first: start}
        pending = [first]
        while pending:
            subset, at = pending.pop()
            source = state_of[(subset, at)]
            if item.accept in subset and (at is None or at not in ends):
                self.nfa.epsilon_edges[source].append(end)
            targets: dict[ExceptPair, list[tuple[int, int]]] = {}
            for byte in range(256):
                reached = {
                    target
                    for state in subset
                    for ranges, target in item.byte_edges[state]
                    if any(low <= byte <= high for low, high in ranges)
                }
                if not reached:
                    continue
                below = None if at is None else children[at].get(byte)
                pair = (epsilon_closure(item, reached), below)
                ranges = targets.setdefault(pair, [])
                if ranges and ranges[-1][1] == byte - 1:
                    ranges[-1] = (ranges[-1][0], byte)
                else:
                    ranges.append((byte, byte))
            for pair, ranges in targets.items():
                if pair not in state_of:
                    state_of[pair] = self.nfa.new_state()
                    pending.append(pair)
                self.nfa.byte_edges[source].append((tuple(ranges), state_of[pair]))

    def build_literal(self, value: bytes, start: int, end: int) -> None:
        if not value:
            self.nfa.epsilon_edges[start].append(end)
            return
        current = start
        for index, byte in enumerate(value):
            following = end if index == len(value) - 1 else self.nfa.new_state()
            self.nfa.byte_edges[current].append((((byte, byte),), following))
            current = following

    def build_repeat(self, node: Repeat, start: int, end: int) -> None:
        nfa = self.nfa
        current = start
        for _ in range(node.minimum):
            following = nfa.new_state()
            self.build(node.item, current, following)
            current = following
        if node.maximum is None:
            # Loop through a fresh state so the loop cannot leak into the caller's edges.
            loop = nfa.new_state()
            nfa.epsilon_edges[current].append(loop)
            body_end = nfa.new_state()
            self.build(node.item, loop, body_end)
            nfa.epsilon_edges[body_end].append(loop)
            nfa.epsilon_edges[loop].append(end)
            return
        for _ in range(node.maximum - node.minimum):
            nfa.epsilon_edges[current].append(end)
            following = nfa.new_state()
            self.build(node.item, current, following)
            current = following
        nfa.epsilon_edges[current].append(end)


def epsilon_closure(nfa: Nfa, states: set[int]) -> frozenset[int]:
    """``states`` and every state their epsilon edges reach. Costs O(states and edges met)."""
    pending = list(states)
    seen = set(states)
    while pending:
        for target in nfa.epsilon_edges[pending.pop()]:
            if target not in seen:
                seen.add(target)
                pending.append(target)
    return frozenset(seen)
