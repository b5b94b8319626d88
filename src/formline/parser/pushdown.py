"""The CFG parser: a byte-level pushdown automaton over per-rule DFAs, run as a set of stacks.

Why this design and not Earley or a lexer: every rule that is not recursive is inlined into
its caller, so a regex, a choice or a non-recursive JSON schema compiles to ONE minimised DFA
and the parser degenerates to a table walk with a single stack. Only rules in a recursion
cycle keep their own DFA and are entered through *call edges*; a parser configuration is then
a small set of stacks of DFA states (GLR-style, like XGrammar's persistent-stack PDA), and
every stack top has a token mask computed once per state (see :mod:`formline.mask.compiled`).
An Earley
parser (llguidance's choice) would also handle left recursion and ambiguity gracefully, but
its items do not map onto per-state masks as directly, and in pure Python each
Earley step allocates items where a DFA step here is one table lookup per stack.
Left recursion is refused at compile time, as llama.cpp does; ambiguity is bounded by
``stack_limit`` (a clear error, never a hang).

Stacks are tuples of global state ids, the top last. Calling a rule replaces the top with the
return state and pushes the callee's start; a rule that accepts may pop. A return state that
can only pop (accepting, no edges) is not pushed at all (tail calls), so right-recursive rules
such as lists run in constant stack depth.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from formline.automata.dfa import Dfa, determinize_reference, live_states, minimize, trim
from formline.automata.native_build import build_tables
from formline.automata.nfa import build_nfa
from formline.grammar.budget import (
    DEFAULT_DFA_STATE_LIMIT,
    DEFAULT_NFA_STATE_LIMIT,
    DEFAULT_STACK_LIMIT,
    Deadline,
)
from formline.grammar.ir import Grammar, GrammarError
from formline.native import rule_references

Stack = tuple[int, ...]
BASE = -1  # bottom marker for walks that start in an unknown context


class ParserLimitError(GrammarError):
    """A parse would keep more stacks than ``stack_limit`` (a highly ambiguous grammar)."""


@dataclass
class PushdownAutomaton:
    """Global tables of all rule DFAs, numbered consecutively.

    The call edges are CSR arrays, as the kernel gives and takes them: state ``s`` calls
    ``call_callee[k]`` returning to ``call_return[k]`` for ``k`` in ``call_begin[s]`` to
    ``call_begin[s + 1]``. The per-state Python lists of the Python parser (:meth:`closure`,
    :meth:`advance`) are made on first use: built at construction they were 0.3 ms of a
    median MaskBench schema's 6 ms compile, for a table the native matcher never reads.
    """

    transitions: np.ndarray  # int32 (states, 256), -1: no transition
    accepting: np.ndarray  # bool (states,)
    call_begin: np.ndarray  # int32 (states + 1,)
    call_callee: np.ndarray  # int32 (calls,): the callee rule's start state
    call_return: np.ndarray  # int32 (calls,): the state the call returns to
    start: int
    rule_names: list[str]
    rule_of_state: np.ndarray  # int32 (states,)
    stack_limit: int = DEFAULT_STACK_LIMIT
    table: memoryview = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # The byte steps read the table through a flat int32 memoryview, table[state << 8 |
        # byte]: no copy (rows as Python arrays cost 14 ms of a 30 ms compile of a
        # 3,000-state schema, or 5 µs per state made on first use, in accept_token's p50).
        self.transitions = np.ascontiguousarray(self.transitions, dtype=np.int32)
        self.table = memoryview(self.transitions.reshape(-1).data)
        for name in ("call_begin", "call_callee", "call_return"):
            setattr(self, name, np.ascontiguousarray(getattr(self, name), dtype=np.int32))

    @classmethod
    def from_call_lists(
        cls,
        transitions: np.ndarray,
        accepting: np.ndarray,
        calls: list[tuple[tuple[int, int], ...]],
        start: int,
        rule_names: list[str],
        rule_of_state: np.ndarray,
        stack_limit: int = DEFAULT_STACK_LIMIT,
    ) -> PushdownAutomaton:
        """An automaton whose calls are given per state as ``(callee, return)`` pairs."""
        begin = np.zeros(len(calls) + 1, dtype=np.int32)
        np.cumsum([len(state_calls) for state_calls in calls], out=begin[1:])
        pairs = np.array([edge for state_calls in calls for edge in state_calls], np.int32)
        pairs = pairs.reshape(-1, 2)
        return cls(
            transitions, accepting, begin, pairs[:, 0], pairs[:, 1], start, rule_names,
            rule_of_state, stack_limit,
        )  # fmt: skip

    @property
    def calls(self) -> list[tuple[tuple[int, int], ...]]:
        """Per state, its ``(callee start, return state)`` pairs. Costs O(states)."""
        return [self.calls_of(state) for state in range(self.size)]

    @cached_property
    def _readable(self) -> list[bool | None]:
        return [None] * self.size

    def has_bytes(self, state: int) -> bool:
        """Whether some byte leaves ``state``. Costs one row's scan the first time (for the
        whole table at once, 3 ms of a 7,000-state schema's first mask)."""
        known = self._readable[state]
        if known is None:
            known = self._readable[state] = bool((self.transitions[state] >= 0).any())
        return known

    @cached_property
    def accepting_list(self) -> list[bool]:
        accepting: list[bool] = self.accepting.astype(bool).tolist()
        return accepting

    @cached_property
    def is_special(self) -> list[bool]:
        """Per state: accepting or calling (a closure has work to do there)."""
        calling = np.diff(self.call_begin) > 0
        special: list[bool] = (self.accepting.astype(bool) | calling).tolist()
        return special

    @cached_property
    def _call_begin(self) -> list[int]:
        begin: list[int] = self.call_begin.tolist()
        return begin

    @cached_property
    def _known_calls(self) -> list[tuple[tuple[int, int], ...] | None]:
        return [None] * self.size

    def calls_of(self, state: int) -> tuple[tuple[int, int], ...]:
        """``state``'s ``(callee start, return state)`` pairs, made once per state (the
        closure of every jump-forward and accept_string step asks again). Costs O(its
        calls) the first time."""
        known = self._known_calls[state]
        if known is None:
            low, high = self._call_begin[state], self._call_begin[state + 1]
            callees = self.call_callee[low:high].tolist()
            returns = self.call_return[low:high].tolist()
            known = self._known_calls[state] = tuple(zip(callees, returns, strict=True))
        return known

    def is_tail(self, state: int) -> bool:
        """Whether ``state`` accepts with nothing after it (a call returning there need not
        push it)."""
        begin = self._call_begin
        return (
            self.accepting_list[state]
            and begin[state] == begin[state + 1]
            and not self.has_bytes(state)
        )

    @property
    def size(self) -> int:
        return int(self.transitions.shape[0])

    def closure(self, stacks: list[Stack]) -> tuple[frozenset[Stack], bool, bool]:
        """Expand calls and returns until every stack top can read a byte.

        Returns ``(stacks, can_end, escapes)``: ``can_end`` when the root rule can finish here,
        ``escapes`` when a stack started on :data:`BASE` can pop into its unknown context.

        Raises:
            ParserLimitError: more than ``stack_limit`` stacks.
        Costs O(stacks visited).
        """
        closed: set[Stack] = set()
        seen: set[Stack] = set()
        pending = list(stacks)
        can_end = escapes = False
        is_special, has_bytes = self.is_special, self.has_bytes
        while pending:
            stack = pending.pop()
            if stack in seen:
                continue
            seen.add(stack)
            top = stack[-1]
            if has_bytes(top):
                closed.add(stack)
            if not is_special[top]:
                continue
            for callee, returning in self.calls_of(top):
                below = stack[:-1]
                pending.append(
                    below + (callee,) if self.is_tail(returning) else below + (returning, callee)
                )
            if self.accepting_list[top]:
                if len(stack) == 1:
                    can_end = True
                elif stack[-2] == BASE and len(stack) == 2:
                    escapes = True
                else:
                    pending.append(stack[:-1])
            if len(seen) > self.stack_limit:
                raise ParserLimitError(
                    f"the parse needs more than {self.stack_limit} stacks: "
                    "the grammar is too ambiguous"
                )
        return frozenset(closed), can_end, escapes

    def step(self, stacks: frozenset[Stack], byte: int) -> list[Stack]:
        """Stacks after reading ``byte`` (before closure). Costs O(len(stacks))."""
        table = self.table
        result = []
        for stack in stacks:
            target = table[stack[-1] << 8 | byte]
            if target >= 0:
                result.append(stack[:-1] + (target,))
        return result

    def advance(
        self, stacks: frozenset[Stack], data: bytes
    ) -> tuple[frozenset[Stack], bool] | None:
        """Closed stacks and ``can_end`` after reading ``data`` from closed ``stacks``.

        Returns ``None`` when ``data`` is rejected. Costs O(len(data) x stacks).
        """
        current = stacks
        can_end = False
        start = 0
        if len(stacks) == 1:
            # One stack whose tops stay plain (inside a string, a number, a key): one table
            # lookup per byte and no closure. accept_string, jump-forward's byte walk and the
            # shortest completion come here (tokens take the kernel's step): a step and a
            # closure per byte made accept_token's p50 6.2 µs (bench/results/maskbench.md).
            (stack,) = stacks
            top = stack[-1]
            table, special = self.table, self.is_special
            for byte in data:
                top = table[top << 8 | byte]
                if top < 0:
                    return None
                start += 1
                if special[top]:
                    break
            else:
                return frozenset((stack[:-1] + (top,),)), False
            current, can_end, _ = self.closure([stack[:-1] + (top,)])
        for byte in data[start:]:
            raw = self.step(current, byte)
            if not raw:
                return None
            current, can_end, _ = self.closure(raw)
        if not current and not can_end:
            return None
        return current, can_end

    def accepts_after(self, stacks: frozenset[Stack], data: bytes) -> bool:
        """Whether ``data`` can be read from closed ``stacks`` (a prefix: the grammar need not
        be able to end there; see :meth:`matches`). Costs O(len(data) x stacks)."""
        current = stacks
        last = len(data) - 1
        for index, byte in enumerate(data):
            raw = self.step(current, byte)
            if not raw:
                return False
            if index == last:
                return True
            current, _, _ = self.closure(raw)
        return True

    def matches(self, data: bytes) -> bool:
        """Whether ``data`` is a complete string of the grammar (from the start, may end).
        Costs O(len(data) x stacks)."""
        stacks, can_end = self.initial()
        if not data:
            return can_end
        result = self.advance(stacks, data)
        return result is not None and result[1]

    def initial(self) -> tuple[frozenset[Stack], bool]:
        """The closed start configuration and whether the empty string is accepted."""
        closed, can_end, _ = self.closure([(self.start,)])
        return closed, can_end


def build_pushdown(
    grammar: Grammar,
    nfa_state_limit: int = DEFAULT_NFA_STATE_LIMIT,
    dfa_state_limit: int = DEFAULT_DFA_STATE_LIMIT,
    stack_limit: int = DEFAULT_STACK_LIMIT,
    deadline: Deadline | None = None,
) -> PushdownAutomaton:
    """Compile a grammar: inline non-recursive rules, one minimised DFA per recursive rule
    (and per rule named in ``grammar.called_rules``), built natively
    (:func:`formline.automata.native_build.build_tables`).

    Raises:
        GrammarError: left recursion, or a grammar (or start rule) that matches nothing.
        AutomatonLimitError: an automaton over its state limit.
        CompileLimitError: ``deadline`` passed.
    Costs O(distinct IR nodes) in Python plus the native build: about a millisecond for a
    small JSON schema; determinisation is bounded by the limits.
    """
    called = recursive_rules(grammar) | grammar.called_rules
    found = build_tables(grammar, called, nfa_state_limit, dfa_state_limit, deadline)
    states = found["states"]
    return PushdownAutomaton(
        transitions=np.frombuffer(found["transitions"], dtype=np.int32).reshape(states, 256),
        accepting=np.frombuffer(found["accepting"], dtype=np.uint8).astype(bool),
        call_begin=np.frombuffer(found["call_begin"], dtype=np.int32),
        call_callee=np.frombuffer(found["call_callee"], dtype=np.int32),
        call_return=np.frombuffer(found["call_return"], dtype=np.int32),
        start=0,
        rule_names=found["rule_order"],
        rule_of_state=np.frombuffer(found["rule_of_state"], dtype=np.int32),
        stack_limit=stack_limit,
    )


def build_pushdown_reference(
    grammar: Grammar,
    nfa_state_limit: int = DEFAULT_NFA_STATE_LIMIT,
    dfa_state_limit: int = DEFAULT_DFA_STATE_LIMIT,
    stack_limit: int = DEFAULT_STACK_LIMIT,
) -> PushdownAutomaton:
    """:func:`build_pushdown` in Python (the NFA builder and subset construction of
    :mod:`formline.automata`): the oracle of the differential tests. Costs seconds on large
    schemas. Raises as :func:`build_pushdown` does (without a deadline)."""
    called = recursive_rules(grammar) | grammar.called_rules
    dfas = _rule_dfas(grammar, called, nfa_state_limit, dfa_state_limit)
    productive = _productive_rules(dfas)
    if grammar.start not in productive:
        raise GrammarError(
            f"the grammar matches no string (rule {grammar.start!r} never completes)"
        )
    trimmed: dict[str, Dfa] = {}
    for name, dfa in dfas.items():
        if name in productive:
            result = trim(dfa, productive)
            assert result is not None
            trimmed[name] = minimize(result)
    _check_left_recursion(trimmed)
    return _link(grammar.start, trimmed, stack_limit)


def recursive_rules(grammar: Grammar) -> set[str]:
    """Rules that can reach themselves through references (Tarjan's SCCs, iterative)."""
    flat = grammar.flat()
    no_calls = np.zeros(len(flat.rule_names), dtype=np.uint8)
    referenced = rule_references(*flat.arrays(), flat.rule_root, no_calls)
    names = flat.rule_names
    edges = {
        names[rule]: [names[other] for other in referenced[rule]] for rule in range(len(names))
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    recursive: set[str] = set()
    counter = 0
    for root in edges:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, child_index = work.pop()
            if child_index == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            if child_index < len(edges[node]):
                work.append((node, child_index + 1))
                child = edges[node][child_index]
                if child not in index:
                    work.append((child, 0))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in edges[node]:
                    recursive.update(component)
    return recursive


def _rule_dfas(
    grammar: Grammar, called: set[str], nfa_limit: int, dfa_limit: int
) -> dict[str, Dfa]:
    dfas: dict[str, Dfa] = {}
    pending = [grammar.start]
    while pending:
        name = pending.pop()
        if name in dfas:
            continue
        nfa = build_nfa(
            grammar.rules[name], grammar.rules.__getitem__, called.__contains__, nfa_limit
        )
        dfas[name] = determinize_reference(nfa, dfa_limit)
        for state_calls in dfas[name].calls:
            pending.extend(rule for rule, _ in state_calls)
    return dfas


def _productive_rules(dfas: dict[str, Dfa]) -> set[str]:
    """Rules that derive some string: a worklist over callers, so a chain of n rules costs
    O(n) reachability checks, not the O(n^2) of repeated passes (30 chained object-member
    rules took 466 trims, 0.54 s, with passes)."""
    callers: dict[str, set[str]] = {name: set() for name in dfas}
    for name, dfa in dfas.items():
        for state_calls in dfa.calls:
            for rule, _ in state_calls:
                callers.setdefault(rule, set()).add(name)
    productive: set[str] = set()
    pending = list(dfas)
    queued = set(pending)
    while pending:
        name = pending.pop()
        queued.discard(name)
        if name in productive or not _reaches_acceptance(dfas[name], productive):
            continue
        productive.add(name)
        for caller in callers.get(name, ()):
            if caller not in productive and caller not in queued:
                pending.append(caller)
                queued.add(caller)
    return productive


def _reaches_acceptance(dfa: Dfa, productive: set[str]) -> bool:
    """Whether an accepting state is reachable from the start through byte edges and calls
    to productive rules: the native search of trimming (the Python one took 0.5 s of a 5.6 s
    compile of a 9,605-state MaskBench schema). Costs O(states x 256)."""
    live, _ = live_states(dfa, productive)
    return bool(live[0])


def _nullable_rules(dfas: dict[str, Dfa]) -> set[str]:
    nullable: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, dfa in dfas.items():
            if name not in nullable and any(_null_reachable(dfa, nullable)[1]):
                nullable.add(name)
                changed = True
    return nullable


def _null_reachable(dfa: Dfa, nullable: set[str]) -> tuple[set[int], list[bool]]:
    """States reachable from the start through calls to nullable rules only."""
    seen = {0}
    pending = [0]
    while pending:
        state = pending.pop()
        for rule, target in dfa.calls[state]:
            if rule in nullable and target not in seen:
                seen.add(target)
                pending.append(target)
    return seen, [bool(dfa.accepting[state]) for state in seen]


def _check_left_recursion(dfas: dict[str, Dfa]) -> None:
    nullable = _nullable_rules(dfas)
    left_calls: dict[str, set[str]] = {}
    for name, dfa in dfas.items():
        states, _ = _null_reachable(dfa, nullable)
        left_calls[name] = {rule for state in states for rule, _ in dfa.calls[state]}
    for name in dfas:
        path = _find_cycle(name, left_calls)
        if path:
            raise GrammarError(
                "left recursion is not supported: "
                + " -> ".join(path)
                + " (rewrite it with repetition, e.g. 'a ::= b (op b)*')"
            )


def _find_cycle(origin: str, graph: dict[str, set[str]]) -> list[str] | None:
    pending: list[tuple[str, list[str]]] = [(origin, [origin])]
    seen: set[str] = set()
    while pending:
        node, path = pending.pop()
        for child in sorted(graph.get(node, ())):
            if child == origin:
                return [*path, origin]
            if child not in seen:
                seen.add(child)
                pending.append((child, [*path, child]))
    return None


def _link(start: str, dfas: dict[str, Dfa], stack_limit: int) -> PushdownAutomaton:
    names = [start, *sorted(name for name in dfas if name != start)]
    offsets: dict[str, int] = {}
    total = 0
    for name in names:
        offsets[name] = total
        total += dfas[name].size
    tables: list[np.ndarray] = []
    accepting: list[np.ndarray] = []
    calls: list[tuple[tuple[int, int], ...]] = []
    rule_of_state: list[np.ndarray] = []
    for rule_index, name in enumerate(names):
        dfa, offset = dfas[name], offsets[name]
        tables.append(np.where(dfa.transitions >= 0, dfa.transitions + offset, -1))
        accepting.append(dfa.accepting)
        calls.extend(
            tuple((offsets[rule], target + offset) for rule, target in state_calls)
            for state_calls in dfa.calls
        )
        rule_of_state.append(np.full(dfa.size, rule_index, dtype=np.int32))
    return PushdownAutomaton.from_call_lists(
        transitions=np.ascontiguousarray(np.concatenate(tables).astype(np.int32)),
        accepting=np.concatenate(accepting),
        calls=calls,
        start=0,
        rule_names=names,
        rule_of_state=np.concatenate(rule_of_state),
        stack_limit=stack_limit,
    )
