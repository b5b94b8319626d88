"""Byte-level DFAs: subset construction, trimming and minimisation.

A :class:`Dfa` has a dense ``(states, 256)`` int32 transition table (``-1`` is the dead state)
so that walking many tokens at once is a numpy gather, plus per-state call edges inherited
from the NFA (a call is treated as one more input symbol while determinising).

Determinisation is bounded by ``state_limit``: ``(a|b)*a(a|b){20}`` needs 2^21 states, and
the limit turns that into an :class:`AutomatonLimitError` after at most ``state_limit`` states
of work instead of a hang or an out-of-memory.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from formline.automata.nfa import AutomatonLimitError, Nfa, epsilon_closure
from formline.grammar.budget import DEFAULT_DFA_STATE_LIMIT
from formline.native import determinize as native_determinize
from formline.native import refine_partition as native_refine_partition
from formline.native import trim_states


@dataclass
class Dfa:
    """A deterministic automaton over bytes with call edges. State 0 is the start."""

    transitions: np.ndarray  # int32 (states, 256); -1 = no transition
    accepting: np.ndarray  # bool (states,)
    calls: list[list[tuple[str, int]]] = field(default_factory=list)

    @property
    def size(self) -> int:
        return int(self.transitions.shape[0])

    def matches(self, data: bytes) -> bool:
        """Whether the DFA (ignoring call edges) accepts ``data`` whole. Costs O(len(data))."""
        state = 0
        for byte in data:
            state = int(self.transitions[state, byte])
            if state < 0:
                return False
        return bool(self.accepting[state])


def _byte_classes(nfa: Nfa) -> np.ndarray:
    """Map each byte to an equivalence class: bytes no edge tells apart share a class."""
    boundaries = {0, 256}
    for edges in nfa.byte_edges:
        for ranges, _ in edges:
            for low, high in ranges:
                boundaries.add(low)
                boundaries.add(high + 1)
    classes = np.zeros(256, dtype=np.int32)
    for index, boundary in enumerate(sorted(boundaries)[:-1]):
        classes[boundary:] = index
    return classes


def determinize(nfa: Nfa, state_limit: int = DEFAULT_DFA_STATE_LIMIT) -> Dfa:
    """Subset construction over byte classes and call symbols, in the native kernel (the
    Python version, :func:`determinize_reference`, took 0.45 s of a 1 s compile of a
    3,510-state MaskBench schema). The NFA goes over as CSR arrays.

    Raises:
        AutomatonLimitError: more than ``state_limit`` DFA states would be needed.
    Costs O(DFA states x NFA states per subset x byte classes).
    """
    edges = [
        (low, high, target)
        for state_edges in nfa.byte_edges
        for ranges, target in state_edges
        for low, high in ranges
    ]
    edge_counts = [sum(len(ranges) for ranges, _ in state_edges) for state_edges in nfa.byte_edges]
    rules = sorted({rule for state_calls in nfa.call_edges for rule, _ in state_calls})
    rule_ids = {rule: index for index, rule in enumerate(rules)}
    calls = [
        (rule_ids[rule], target) for state_calls in nfa.call_edges for rule, target in state_calls
    ]
    edge_array = np.array(edges, dtype=np.int32).reshape(-1, 3)
    call_array = np.array(calls, dtype=np.int32).reshape(-1, 2)
    result = native_determinize(
        _csr_begin(edge_counts),
        np.ascontiguousarray(edge_array[:, 0]),
        np.ascontiguousarray(edge_array[:, 1]),
        np.ascontiguousarray(edge_array[:, 2]),
        _csr_begin([len(targets) for targets in nfa.epsilon_edges]),
        np.array([t for targets in nfa.epsilon_edges for t in targets], dtype=np.int32),
        _csr_begin([len(state_calls) for state_calls in nfa.call_edges]),
        np.ascontiguousarray(call_array[:, 0]),
        np.ascontiguousarray(call_array[:, 1]),
        nfa.start,
        nfa.accept,
        state_limit,
    )
    if result is None:
        raise AutomatonLimitError(
            f"the automaton needs more than {state_limit} DFA states "
            "(a pattern such as (a|b)*a(a|b){20} grows exponentially)",
            "dfa_states",
            state_limit,
        )
    return dfa_from_native(result, rules)


def dfa_from_native(
    result: tuple[bytes, int, bytes, bytes, bytes, bytes, bytes, int], rules: list[str]
) -> Dfa:
    """A :class:`Dfa` from the kernel's subset construction (its arrays as bytes; call rules
    as indices into ``rules``). Costs O(states x 256) for the byte table."""
    classes, class_count, rows, accepting, begin, rule_column, target_column, states = result
    class_table = np.frombuffer(rows, dtype=np.int32).reshape(states, class_count)
    transitions = np.ascontiguousarray(class_table[:, np.frombuffer(classes, dtype=np.int32)])
    bounds = np.frombuffer(begin, dtype=np.int32).tolist()
    pairs = list(
        zip(
            np.frombuffer(rule_column, dtype=np.int32).tolist(),
            np.frombuffer(target_column, dtype=np.int32).tolist(),
            strict=True,
        )
    )
    dfa_calls = [
        [(rules[rule], target) for rule, target in pairs[bounds[state] : bounds[state + 1]]]
        for state in range(states)
    ]
    return Dfa(transitions, np.frombuffer(accepting, dtype=np.uint8).astype(bool), dfa_calls)


def _csr_begin(counts: list[int]) -> np.ndarray:
    begin = np.zeros(len(counts) + 1, dtype=np.int32)
    np.cumsum(counts, out=begin[1:])
    return begin


def determinize_reference(nfa: Nfa, state_limit: int = DEFAULT_DFA_STATE_LIMIT) -> Dfa:
    """The Python subset construction: the reference the native one is tested against.
    Costs O(DFA states x NFA states per subset x byte classes)."""
    classes = _byte_classes(nfa)
    class_of = classes.tolist()
    class_count = int(classes.max()) + 1
    moves: list[list[tuple[list[int], int]]] = []
    for edges in nfa.byte_edges:
        state_moves = []
        for ranges, target in edges:
            # Classes are numbered in byte order, so a range covers a run of them.
            covered = sorted(
                {c for low, high in ranges for c in range(class_of[low], class_of[high] + 1)}
            )
            state_moves.append((covered, target))
        moves.append(state_moves)
    start = epsilon_closure(nfa, {nfa.start})
    index_of = {start: 0}
    subsets = [start]
    rows: list[list[int]] = []
    calls: list[list[tuple[str, int]]] = []
    # Many byte classes of one subset lead to the same target set (every UTF-8 continuation
    # class inside a JSON string, say): computing its closure once per distinct set halved
    # determinisation of a 40-character string field (0.17 s of 0.25 s was closures).
    interned: dict[frozenset[int], int] = {}
    cursor = 0
    while cursor < len(subsets):
        subset = subsets[cursor]
        cursor += 1
        by_class: dict[int, set[int]] = defaultdict(set)
        by_rule: dict[str, set[int]] = defaultdict(set)
        for state in subset:
            for covered, target in moves[state]:
                for class_index in covered:
                    by_class[class_index].add(target)
            for rule, target in nfa.call_edges[state]:
                by_rule[rule].add(target)

        def intern(targets: set[int]) -> int:
            key = frozenset(targets)
            known = interned.get(key)
            if known is not None:
                return known
            closure = epsilon_closure(nfa, targets)
            found = index_of.get(closure)
            if found is None:
                if len(subsets) >= state_limit:
                    raise AutomatonLimitError(
                        f"the automaton needs more than {state_limit} DFA states "
                        "(a pattern such as (a|b)*a(a|b){20} grows exponentially)",
                        "dfa_states",
                        state_limit,
                    )
                found = index_of[closure] = len(subsets)
                subsets.append(closure)
            interned[key] = found
            return found

        row = [-1] * class_count
        for class_index, targets in by_class.items():
            row[class_index] = intern(targets)
        rows.append(row)
        calls.append([(rule, intern(targets)) for rule, targets in sorted(by_rule.items())])
    class_table = np.array(rows, dtype=np.int32).reshape(len(rows), class_count)
    transitions = np.ascontiguousarray(class_table[:, classes])
    accepting = np.array([nfa.accept in subset for subset in subsets], dtype=bool)
    return Dfa(transitions, accepting, calls)


def live_states(dfa: Dfa, productive_rules: set[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(live, reachable)`` flags: states that reach acceptance, and live states reached from
    the start, through byte edges and calls to productive rules. Native: the Python searches
    over per-state predecessor sets took 0.26 s of a 2.3 s compile of a 3,510-state MaskBench
    schema. Costs O(states x 256)."""
    edges = [
        (source, target)
        for source, state_calls in enumerate(dfa.calls)
        for rule, target in state_calls
        if rule in productive_rules
    ]
    live = np.zeros(dfa.size, dtype=np.uint8)
    reachable = np.zeros(dfa.size, dtype=np.uint8)
    trim_states(
        np.ascontiguousarray(dfa.transitions, dtype=np.int32),
        np.array([source for source, _ in edges], dtype=np.int32),
        np.array([target for _, target in edges], dtype=np.int32),
        dfa.accepting.astype(np.uint8),
        live,
        reachable,
    )
    return live, reachable


def trim(dfa: Dfa, productive_rules: set[str]) -> Dfa | None:
    """Drop states that cannot reach acceptance and calls to unproductive rules.

    Returns ``None`` when the start state itself is dead (the automaton accepts nothing).
    Costs O(states x 256).
    """
    size = dfa.size
    live, reachable_flags = live_states(dfa, productive_rules)
    if not live[0]:
        return None
    reachable = set(np.nonzero(reachable_flags)[0].tolist())
    order = sorted(reachable)
    renumber = np.full(size + 1, -1, dtype=np.int32)
    renumber[np.array(order)] = np.arange(len(order), dtype=np.int32)
    table = dfa.transitions[order]
    table = renumber[np.where(table >= 0, table, size)]
    calls = [
        [
            (rule, int(renumber[target]))
            for rule, target in dfa.calls[state]
            if rule in productive_rules and target in reachable
        ]
        for state in order
    ]
    return Dfa(np.ascontiguousarray(table), dfa.accepting[order].copy(), calls)


def minimize(dfa: Dfa) -> Dfa:
    """Merge equivalent states (Moore partition refinement, vectorised with numpy).

    Call edges take part in the equivalence as extra input symbols. Costs
    O(rounds x states x 256); rounds are at most the DFA's depth.
    """
    size = dfa.size
    rules = sorted({rule for state_calls in dfa.calls for rule, _ in state_calls})
    call_columns = np.full((size, len(rules)), -1, dtype=np.int32)
    for state, state_calls in enumerate(dfa.calls):
        for rule, target in state_calls:
            call_columns[state, rules.index(rule)] = target
    targets = np.concatenate([dfa.transitions, call_columns], axis=1)
    partition = refine_partition(targets, dfa.accepting.astype(np.int64))
    # Renumber so the start state's block is 0 and blocks appear in first-seen order.
    _, first_seen = np.unique(partition, return_index=True)
    block_order = np.argsort(first_seen)
    rank = np.empty_like(block_order)
    rank[block_order] = np.arange(len(block_order))
    partition = rank[partition]
    representatives = first_seen[block_order]
    table = dfa.transitions[representatives]
    table = np.where(table >= 0, partition[np.maximum(table, 0)], -1).astype(np.int32)
    calls = [
        [(rule, int(partition[target])) for rule, target in dfa.calls[state]]
        for state in representatives.tolist()
    ]
    return Dfa(np.ascontiguousarray(table), dfa.accepting[representatives].copy(), calls)


def _label_rows(rows: np.ndarray) -> np.ndarray:
    """Equal rows get equal labels 0..k-1 (exact: rows compared as raw bytes)."""
    contiguous = np.ascontiguousarray(rows)
    as_bytes = contiguous.view(np.dtype((np.void, contiguous.dtype.itemsize * rows.shape[1])))
    _, labels = np.unique(as_bytes.reshape(-1), return_inverse=True)
    return labels.reshape(-1).astype(np.int64)


def refine_partition(
    targets: np.ndarray, labels: np.ndarray, rounds: int | None = None
) -> np.ndarray:
    """Moore refinement of ``labels`` over the ``targets`` table (``-1``: no transition).

    With ``rounds=None`` it runs to the fixpoint (full equivalence); with ``rounds=k`` two
    states share a label iff they agree on every path of length <= k (definedness and the
    initial labels along it). Runs in the native kernel: the numpy version below
    (:func:`refine_partition_reference`) took 1.0 s of a 2.3 s compile of a 3,510-state
    MaskBench schema, its rounds as many as the automaton is deep. Costs
    O(rounds x states x distinct columns).
    """
    size = targets.shape[0]
    out = np.zeros(size, dtype=np.int32)
    if size == 0:
        return out.astype(np.int64)
    native_refine_partition(
        np.ascontiguousarray(targets, dtype=np.int32),
        np.ascontiguousarray(labels, dtype=np.int64),
        -1 if rounds is None else rounds,
        out,
    )
    return out.astype(np.int64)


def refine_partition_reference(
    targets: np.ndarray, labels: np.ndarray, rounds: int | None = None
) -> np.ndarray:
    """The numpy Moore refinement: the reference the native one is tested against.
    Costs O(rounds x states x columns)."""
    _, partition = np.unique(labels, return_inverse=True)
    partition = partition.reshape(-1).astype(np.int64)
    count = int(partition.max()) + 1 if len(partition) else 0
    if targets.shape[0] and targets.shape[1] > 1:
        # Equal columns (bytes of one class) refine identically: keep one of each. A JSON
        # string automaton has ~20 distinct columns of 256, and the rounds are as many as
        # the automaton is deep (hundreds for a maxLength), so this is the main cost.
        targets = np.unique(targets, axis=1)
    done = 0
    while rounds is None or done < rounds:
        mapped = np.where(targets >= 0, partition[np.maximum(targets, 0)], -1)
        partition = _label_rows(np.concatenate([partition[:, None], mapped], axis=1))
        done += 1
        new_count = int(partition.max()) + 1 if len(partition) else 0
        if new_count == count:
            break
        count = new_count
    return partition
