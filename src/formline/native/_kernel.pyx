# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
# distutils: language = c++
"""Python binding of the C++ mask kernel (``kernel.hpp``): a vocabulary's token trie and one
lazy mask kernel per compiled grammar. Every call that walks releases the GIL."""

from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from libcpp cimport bool as cpp_bool
from libcpp.memory cimport shared_ptr
from libcpp.utility cimport move
from libcpp.vector cimport vector
from libcpp.string cimport string
from libcpp.unordered_map cimport unordered_map
from cpython.object cimport PyObject
from cython.operator cimport dereference
from libc.string cimport memcpy, memset

import operator

cdef object _MISSING = object()  # a cached step may be None
ctypedef PyObject* NodeAddress  # flatten_rules' key of a node object (a borrowed reference)

cdef extern from "automaton.hpp" namespace "formline" nogil:

    cdef cppclass LazyAutomaton:
        LazyAutomaton(int32_t capacity, int32_t stack_limit) except +
        int32_t size()
        int32_t capacity()
        int32_t stack_limit()
        cpp_bool failed()
        int32_t rules_built()
        cpp_bool is_expanded(int32_t state)
        const int32_t* row(int32_t state) except +
        const uint8_t* accepting()
        const uint8_t* has_bytes()
        const int32_t* calls_of(int32_t state)
        int32_t rule_of(int32_t state)
        size_t memory_bytes()
        void add_given_state(const int32_t* row, cpp_bool accepting, const int32_t* callees,
                             const int32_t* returns, int32_t call_count, int32_t rule) except +
        void set_given_start(int32_t start_rule, cpp_bool start_called)
        int expand_all() except +

    shared_ptr[LazyAutomaton] make_automaton "std::make_shared<formline::LazyAutomaton>"(
        int32_t capacity, int32_t stack_limit
    ) except +


cdef extern from "kernel.hpp" namespace "formline" nogil:
    cdef cppclass Trie:
        int32_t node_count()
        int32_t max_depth

    cdef cppclass TokenTable:
        Trie trie
        int32_t words
        vector[uint8_t] data
        vector[int64_t] offsets
        vector[int32_t] lengths
        int32_t vocabulary_size

    cdef struct KernelStatistics:
        int64_t states_walked
        int64_t unique_masks
        int64_t escape_entries
        int64_t escape_checks
        int64_t memory_bytes
        int64_t closed_states
        int64_t piece_transitions
        int64_t alike_walks
        int64_t bounded_walks

    cdef cppclass Config:
        vector[int32_t] data
        vector[int32_t] starts

    cdef cppclass StepBuffers:
        vector[int32_t] flat
        Config out
        cpp_bool busy

    StepBuffers& step_buffers()

    cdef cppclass MaskKernel:
        # except +: a lazy automaton's row made here can run out of memory (MemoryError).
        int fill(const int32_t* flat, int32_t flat_length, cpp_bool can_end,
                 uint32_t* out) except +
        int advance(const int32_t* flat, int32_t flat_length, const uint8_t* data,
                    int32_t length, Config& out) except +
        KernelStatistics statistics()
        cpp_bool is_walked(int32_t state)

    TokenTable* new_token_table(
        const uint8_t* data, int64_t data_length, const int64_t* offsets, const int32_t* lengths,
        const int32_t* ids, int32_t count, int32_t vocabulary_size
    ) except +
    MaskKernel* new_mask_kernel(
        const TokenTable* table, shared_ptr[LazyAutomaton] automaton, const int32_t* eos_ids,
        int32_t eos_count, int64_t cache_limit_bytes
    ) except +


cdef extern from "batch.hpp" namespace "formline" nogil:
    cdef cppclass BatchFill:
        void add(MaskKernel* kernel, vector[int32_t] flat, cpp_bool can_end, uint32_t* out)
        int run(int threads) except +
    void copy_rows(const uint32_t* const* sources, const int64_t* widths, int32_t* bitmask,
                   int64_t columns, const int64_t* rows, size_t count, int threads) except +


cdef extern from "apply.hpp" namespace "formline" nogil:
    void apply_bitmask_rows[Bits](
        Bits* logits, int64_t vocabulary, const uint32_t* mask, int64_t words,
        const int64_t* logit_rows, const int64_t* mask_rows, int64_t count, int64_t width,
        Bits negative_infinity
    )


ctypedef fused logit_bits:
    uint16_t
    uint32_t
    uint64_t


cdef extern from "spin_mutex.hpp" namespace "formline" nogil:
    int64_t count_under_spin_mutex(int threads, int rounds, int hold_every,
                                   int hold_microseconds) except +

cdef extern from "pool.hpp" namespace "formline" nogil:
    cdef cppclass HelperPool:
        @staticmethod
        HelperPool& shared() except +
        void prepare(int helpers) except +
        void release()
        int helper_count()


cdef extern from "dfa.hpp" namespace "formline" nogil:
    int32_t refine_partition_native "formline::refine_partition"(
        const int32_t* targets, int32_t states, int32_t columns, const int64_t* labels,
        int32_t rounds, int32_t* out
    )

    void trim_states_native "formline::trim_states"(
        const int32_t* transitions, int32_t states, const int32_t* extra_source,
        const int32_t* extra_target, int32_t extra, const uint8_t* accepting, uint8_t* live,
        uint8_t* reachable
    )

    cdef cppclass DeterminizeResult:
        vector[int32_t] classes
        int32_t class_count
        vector[int32_t] rows
        vector[uint8_t] accepting
        vector[int32_t] call_begin, call_rule, call_target
        int32_t states

    int determinize_native "formline::determinize"(
        int32_t nfa_states, const int32_t* edge_begin, const int32_t* edge_low,
        const int32_t* edge_high, const int32_t* edge_target, const int32_t* epsilon_begin,
        const int32_t* epsilon_target, const int32_t* call_begin, const int32_t* call_rule,
        const int32_t* call_target, int32_t start, int32_t accept, int32_t state_limit,
        DeterminizeResult& result
    ) except +

cdef extern from "thompson.hpp" namespace "formline" nogil:
    cdef struct FlatGrammar:
        const int8_t* kind
        const int32_t* a
        const int32_t* b
        const int32_t* c
        const int32_t* children
        const uint8_t* bytes
        const int32_t* range_pairs
        const int32_t* rule_root
        const uint8_t* rule_called
        int32_t node_count
        int64_t children_count, byte_count, range_count



cdef extern from "flat_index.hpp" namespace "formline" nogil:
    cdef cppclass AddressIndex:
        int32_t find(const void* address)
        void insert(const void* address, int32_t value) except +
    cdef cppclass BytesIndex:
        int32_t find(const char* data, size_t length)
        void insert(const char* data, size_t length, int32_t value) except +


cdef extern from "lazy_build.hpp" namespace "formline" nogil:
    cdef cppclass LazyBuildResult:
        shared_ptr[LazyAutomaton] automaton
        vector[int32_t] cycle
        vector[int32_t] rule_order
        int32_t failed_rule
        int32_t nfa_states
        int64_t total_nfa_states

    vector[vector[int32_t]] rule_references_native "formline::rule_references"(
        const FlatGrammar& grammar, int32_t nodes, int32_t rule_count
    ) except +
    vector[int32_t] recursive_rules_native "formline::recursive_rules"(
        const vector[vector[int32_t]]& references
    ) except +

    int build_lazy_automaton(
        const FlatGrammar& grammar, int32_t rule_count, int32_t start, int64_t nfa_limit,
        int32_t capacity, int32_t stack_limit, double seconds, LazyBuildResult& result
    ) except +


STACK_LIMIT_EXCEEDED = -1
STATE_LIMIT_EXCEEDED = -3


cdef class NativeAutomaton:
    """A grammar's pushdown automaton in the kernel (``automaton.hpp``): made lazily by
    :func:`build_automaton` (a DFA state when a walk or step first reaches it) or given whole
    by :meth:`from_tables`. Shared by the compiled grammar's mask kernel; safe across threads
    (a state is expanded under the automaton's lock)."""

    cdef shared_ptr[LazyAutomaton] automaton

    @staticmethod
    def from_tables(
        const int32_t[:, ::1] transitions,
        const uint8_t[::1] accepting,
        const int32_t[::1] call_begin,
        const int32_t[::1] call_callee,
        const int32_t[::1] call_return,
        const int32_t[::1] rule_of_state,
        int stack_limit,
    ):
        """An automaton of the given tables, every state expanded (state 0 the start).

        Raises:
            ValueError: the arrays disagree in size or a state index is out of range.
        Costs O(states x 256)."""
        cdef int32_t size = transitions.shape[0]
        cdef int32_t calls = call_callee.shape[0]
        if size < 1 or transitions.shape[1] != 256 or accepting.shape[0] != size:
            raise ValueError("transitions must be (states, 256), states > 0, accepting (states,)")
        if call_begin.shape[0] != size + 1 or call_return.shape[0] != calls:
            raise ValueError("automaton arrays disagree on the number of states or calls")
        if rule_of_state.shape[0] != size or stack_limit < 1:
            raise ValueError("rule_of_state must be (states,) and the stack limit positive")
        cdef int32_t state, byte, k
        for state in range(size):
            for byte in range(256):
                if not -1 <= transitions[state, byte] < size:
                    raise ValueError("a transition names a state out of range")
        if call_begin[0] != 0 or call_begin[size] != calls:
            raise ValueError("call_begin must run from 0 to the number of calls")
        for k in range(calls):
            if not (0 <= call_callee[k] < size and 0 <= call_return[k] < size):
                raise ValueError("a call names a state out of range")
        for state in range(size):
            if call_begin[state] > call_begin[state + 1]:
                raise ValueError("call_begin must not decrease")
        cdef NativeAutomaton result = NativeAutomaton.__new__(NativeAutomaton)
        result.automaton = make_automaton(size, stack_limit)
        cdef LazyAutomaton* automaton = result.automaton.get()
        cdef int32_t dummy = 0
        cdef cpp_bool start_called = False
        for k in range(calls):
            start_called = start_called or call_callee[k] == 0
        for state in range(size):
            k = call_begin[state]
            automaton.add_given_state(
                &transitions[state, 0], accepting[state] != 0,
                &call_callee[k] if k < calls else &dummy,
                &call_return[k] if k < calls else &dummy,
                call_begin[state + 1] - k, rule_of_state[state],
            )
        automaton.set_given_start(rule_of_state[0], start_called)
        return result

    @property
    def size(self):
        """States made so far."""
        return self.automaton.get().size()

    @property
    def capacity(self):
        return self.automaton.get().capacity()

    @property
    def stack_limit(self):
        return self.automaton.get().stack_limit()

    @property
    def failed(self):
        """Whether more states were needed than the capacity (every walk reports it since)."""
        return self.automaton.get().failed()

    @property
    def rules_built(self):
        """How many rules have their NFA so far: a build whose rules surely derive strings
        makes the start's, and each other's when a walk or a step first enters it."""
        return self.automaton.get().rules_built()

    def row(self, int state):
        """``state``'s 256 transitions (int32, -1: none) as bytes, expanded first.

        Raises:
            IndexError: ``state`` is not a state made so far."""
        cdef LazyAutomaton* automaton = self.automaton.get()
        if not 0 <= state < automaton.size():
            raise IndexError(f"state {state} is not one of the {automaton.size()} made")
        cdef const int32_t* row
        with nogil:
            row = automaton.row(state)
        return PyBytes_FromStringAndSize(<const char*>row, 1024)

    def state(self, int state):
        """``(accepting, has_bytes, calls, rule)`` of ``state``: ``calls`` a tuple of
        ``(callee start, return state)`` pairs, ``rule`` its rule's index.

        Raises:
            IndexError: ``state`` is not a state made so far."""
        cdef LazyAutomaton* automaton = self.automaton.get()
        if not 0 <= state < automaton.size():
            raise IndexError(f"state {state} is not one of the {automaton.size()} made")
        cdef const int32_t* calls = automaton.calls_of(state)
        cdef int32_t count = calls[0] if calls != NULL else 0
        pairs = tuple([(calls[1 + 2 * k], calls[2 + 2 * k]) for k in range(count)])
        return (
            automaton.accepting()[state] != 0,
            automaton.has_bytes()[state] != 0,
            pairs,
            automaton.rule_of(state),
        )

    def expand_all(self):
        """Expand every state (reached states make more): 0, or :data:`STATE_LIMIT_EXCEEDED`
        past the capacity. Costs a subset construction step per state not yet expanded."""
        cdef int status
        with nogil:
            status = self.automaton.get().expand_all()
        return status

    def tables(self):
        """The automaton as arrays (bytes), once :meth:`expand_all` has run: ``transitions``
        (int32 states x 256), ``accepting`` (uint8), ``call_begin``, ``call_callee``,
        ``call_return`` and ``rule_of_state`` (int32).

        Raises:
            ValueError: a state is not expanded."""
        cdef LazyAutomaton* automaton = self.automaton.get()
        cdef int32_t size = automaton.size(), state, k, count
        cdef vector[int32_t] transitions, begin, callee, returning, rules
        cdef vector[uint8_t] accepting
        cdef const int32_t* row
        cdef const int32_t* calls
        begin.push_back(0)
        for state in range(size):
            if not automaton.is_expanded(state):
                raise ValueError(f"state {state} is not expanded: run expand_all() first")
            row = automaton.row(state)
            transitions.insert(transitions.end(), row, row + 256)
            accepting.push_back(automaton.accepting()[state])
            rules.push_back(automaton.rule_of(state))
            calls = automaton.calls_of(state)
            count = calls[0] if calls != NULL else 0
            for k in range(count):
                callee.push_back(calls[1 + 2 * k])
                returning.push_back(calls[2 + 2 * k])
            begin.push_back(callee.size())
        return {
            "transitions": _int32_bytes(transitions),
            "accepting": PyBytes_FromStringAndSize(<char*>accepting.data(), accepting.size()),
            "call_begin": _int32_bytes(begin),
            "call_callee": _int32_bytes(callee),
            "call_return": _int32_bytes(returning),
            "rule_of_state": _int32_bytes(rules),
        }

    def memory_bytes(self):
        """Bytes the automaton holds: rows, call lists, the NFA state sets."""
        return self.automaton.get().memory_bytes()


cdef bytes _int32_bytes(vector[int32_t]& values):
    return PyBytes_FromStringAndSize(<char*>values.data(), values.size() * 4)


def determinize(
    const int32_t[::1] edge_begin,
    const int32_t[::1] edge_low,
    const int32_t[::1] edge_high,
    const int32_t[::1] edge_target,
    const int32_t[::1] epsilon_begin,
    const int32_t[::1] epsilon_target,
    const int32_t[::1] call_begin,
    const int32_t[::1] call_rule,
    const int32_t[::1] call_target,
    int start,
    int accept,
    int state_limit,
):
    """Subset construction (see ``kernel.hpp``). Returns ``None`` past ``state_limit``, else
    (classes, class count, rows, accepting, call begin, call rule, call target, states) with
    the arrays as bytes (int32; accepting uint8). The GIL is released."""
    cdef int32_t nfa_states = edge_begin.shape[0] - 1
    if nfa_states <= 0 or epsilon_begin.shape[0] != nfa_states + 1:
        raise ValueError("determinize: the CSR arrays disagree on the number of states")
    if call_begin.shape[0] != nfa_states + 1 or not (0 <= start < nfa_states):
        raise ValueError("determinize: bad call edges or start state")
    cdef int32_t dummy = 0
    cdef const int32_t* low = &edge_low[0] if edge_low.shape[0] else &dummy
    cdef const int32_t* high = &edge_high[0] if edge_high.shape[0] else &dummy
    cdef const int32_t* target = &edge_target[0] if edge_target.shape[0] else &dummy
    cdef const int32_t* epsilon = &epsilon_target[0] if epsilon_target.shape[0] else &dummy
    cdef const int32_t* rule = &call_rule[0] if call_rule.shape[0] else &dummy
    cdef const int32_t* called = &call_target[0] if call_target.shape[0] else &dummy
    cdef DeterminizeResult result
    cdef int status
    with nogil:
        status = determinize_native(
            nfa_states, &edge_begin[0], low, high, target, &epsilon_begin[0], epsilon,
            &call_begin[0], rule, called, start, accept, state_limit, result,
        )
    if status != 0:
        return None
    return (
        _int32_bytes(result.classes),
        result.class_count,
        _int32_bytes(result.rows),
        PyBytes_FromStringAndSize(<char*>result.accepting.data(), result.accepting.size()),
        _int32_bytes(result.call_begin),
        _int32_bytes(result.call_rule),
        _int32_bytes(result.call_target),
        result.states,
    )





cdef int32_t _NO_INT = 0  # what an empty array's pointer points at (never read)
cdef uint8_t _NO_BYTE = 0


cdef FlatGrammar _flat_grammar(
    const int8_t[::1] kind,
    const int32_t[::1] a,
    const int32_t[::1] b,
    const int32_t[::1] c,
    const int32_t[::1] children,
    const uint8_t[::1] data,
    const int32_t[::1] range_pairs,
    const int32_t[::1] rule_root,
    const uint8_t[::1] rule_called,
) except *:
    """The kernel's view of the flattened IR (the arrays must outlive its use)."""
    cdef Py_ssize_t nodes = kind.shape[0]
    if nodes == 0 or a.shape[0] != nodes or b.shape[0] != nodes or c.shape[0] != nodes:
        raise ValueError("the flattened grammar's node arrays disagree in length")
    if rule_called.shape[0] != rule_root.shape[0] or rule_root.shape[0] == 0:
        raise ValueError("the flattened grammar's rule arrays disagree in length")
    cdef FlatGrammar grammar
    grammar.kind = &kind[0]
    grammar.a = &a[0]
    grammar.b = &b[0]
    grammar.c = &c[0]
    grammar.children = &children[0] if children.shape[0] else &_NO_INT
    grammar.bytes = &data[0] if data.shape[0] else &_NO_BYTE
    grammar.range_pairs = &range_pairs[0] if range_pairs.shape[0] else &_NO_INT
    grammar.rule_root = &rule_root[0]
    grammar.rule_called = &rule_called[0]
    grammar.node_count = <int32_t>nodes
    grammar.children_count = children.shape[0]
    grammar.byte_count = data.shape[0]
    grammar.range_count = range_pairs.shape[0] // 2
    return grammar


def build_automaton(
    const int8_t[::1] kind,
    const int32_t[::1] a,
    const int32_t[::1] b,
    const int32_t[::1] c,
    const int32_t[::1] children,
    const uint8_t[::1] data,
    const int32_t[::1] range_pairs,
    const int32_t[::1] rule_root,
    const uint8_t[::1] rule_called,
    int start,
    long long nfa_limit,
    int capacity,
    int stack_limit,
    double seconds,
):
    """A grammar's lazy automaton from the flattened IR (see ``lazy_build.hpp``), the GIL
    released: the rules' NFAs, trimmed (the start's alone where the others can wait for a
    state that calls them), and the start state; the other DFA states are made as walks
    reach them, at most ``capacity``. Returns a dict: ``status`` (0, or -2 NFA limit,
    -3 state limit, -4 out of time, -5 nothing derivable, -6 left recursion, -7 an Except's
    item calls a rule, -8 malformed arrays), ``failed_rule``, ``nfa_states`` (of the failing rule, or all built),
    ``cycle`` (rule indices) and, on success, ``automaton`` (a :class:`NativeAutomaton`) and
    ``rule_order`` (the rules it has, by index: the start, then ascending)."""
    cdef FlatGrammar grammar = _flat_grammar(
        kind, a, b, c, children, data, range_pairs, rule_root, rule_called
    )
    cdef int32_t rules = rule_root.shape[0]
    if not (0 <= start < rules):
        raise ValueError("build_automaton: the start rule is not one of the rules")
    if capacity < 1 or stack_limit < 1:
        raise ValueError("build_automaton: the capacity and the stack limit must be positive")
    cdef LazyBuildResult result
    cdef int status
    with nogil:
        status = build_lazy_automaton(grammar, rules, start, nfa_limit, capacity, stack_limit,
                                      seconds, result)
    found = {
        "status": status,
        "failed_rule": result.failed_rule,
        "nfa_states": result.nfa_states if status != 0 else result.total_nfa_states,
        "cycle": [rule for rule in result.cycle],
        "rule_order": [rule for rule in result.rule_order],
        "automaton": None,
    }
    cdef NativeAutomaton automaton
    if status == 0:
        automaton = NativeAutomaton.__new__(NativeAutomaton)
        automaton.automaton = result.automaton
        found["automaton"] = automaton
    return found


def recursive_rule_indices(
    const int8_t[::1] kind,
    const int32_t[::1] a,
    const int32_t[::1] b,
    const int32_t[::1] c,
    const int32_t[::1] children,
    const uint8_t[::1] data,
    const int32_t[::1] range_pairs,
    const int32_t[::1] rule_root,
    const uint8_t[::1] rule_called,
):
    """The rule indices (sorted) whose bodies reach themselves through references, directly
    or through other rules (``rule_graph.hpp``'s ``recursive_rules``), the GIL released.
    Costs O(distinct nodes x rules) for the references, O(rules + references) for the rest."""
    cdef FlatGrammar grammar = _flat_grammar(
        kind, a, b, c, children, data, range_pairs, rule_root, rule_called
    )
    cdef vector[int32_t] found
    with nogil:
        found = recursive_rules_native(
            rule_references_native(grammar, grammar.node_count, <int32_t>rule_root.shape[0])
        )
    return [rule for rule in found]


def flatten_rules(list roots, dict rule_number, tuple classes):
    """The IR of ``roots`` (each rule's body, rules in order) as flat arrays, equal subtrees
    once, children first: ``grammar.ir.flatten``'s loop, here because it was 30% of a small
    schema's compile at 1.5 µs a node in Python. Nodes are numbered by value, not identity (a
    node's key is its kind with its fields, its children by number): the schema compiler
    builds equal subtrees as distinct objects (a number's signed and unsigned branches), and
    one flat node is one piece of automaton that the NFA build enters through one shared state
    where the ends agree. ``classes`` are the IR's node classes (ByteSet, Literal, Sequence,
    Choice, Repeat, RuleReference, Except, Minimized), passed in so that this module imports nothing of
    formline. Returns (kind, a, b, c, children, data, range_pairs) as bytes (int8, int32 x 5,
    uint8 x 1 for data) and the root numbers; an unknown reference raises ``KeyError`` with
    its name, an unknown node type ``TypeError``.

    The objects met and the values numbered are C++ maps: keyed by the object's address (the
    roots keep every node alive for the call) and by the value as bytes (the kind, then the
    fields, children by number), not by Python tuples of ``id()`` integers. With those, a node
    object cost 0.5 µs (MaskBench's largest grammars, 2,000-3,600 objects: 1-2 ms of their time
    to first mask); 0.15 with std::unordered_map, less with open addressing
    (``flat_index.hpp``)."""
    cdef AddressIndex numbers  # a node object -> its number
    cdef BytesIndex by_value  # a node's value as bytes -> its number
    cdef vector[NodeAddress] pending  # borrowed: every node lives in the roots' trees
    cdef vector[cpp_bool] expanded  # pending's: its children are numbered already
    cdef vector[int8_t] kind
    cdef vector[int32_t] a, b, c, children, ranges
    cdef vector[uint8_t] data
    cdef list root_numbers = []
    cdef string key
    cdef PyObject* address
    cdef cpp_bool is_expanded
    cdef int32_t number, item, minimum, maximum, low, high
    byte_set, literal, sequence, choice, repeat, reference, exception, minimized = classes
    for root in roots:
        pending.push_back(<PyObject*>root)
        expanded.push_back(False)
        while not pending.empty():
            address = pending.back()
            is_expanded = expanded.back()
            pending.pop_back()
            expanded.pop_back()
            if numbers.find(address) >= 0:
                continue
            node = <object>address
            node_type = type(node)
            if not is_expanded:
                if node_type is sequence or node_type is choice:
                    below = node.items if node_type is sequence else node.options
                    if below:
                        pending.push_back(address)
                        expanded.push_back(True)
                        for child in below:
                            if numbers.find(<PyObject*>child) < 0:
                                pending.push_back(<PyObject*>child)
                                expanded.push_back(False)
                        continue
                elif node_type is repeat or node_type is exception or node_type is minimized:
                    pending.push_back(address)
                    expanded.push_back(True)
                    child = node.item
                    if numbers.find(<PyObject*>child) < 0:
                        pending.push_back(<PyObject*>child)
                        expanded.push_back(False)
                    continue
            key.clear()
            if node_type is byte_set:
                key.push_back(0)
                for low, high in node.ranges:
                    key.push_back(<char>low)
                    key.push_back(<char>high)
            elif node_type is literal:
                key.push_back(1)
                _append_bytes(key, node.value)
            elif node_type is sequence or node_type is choice:
                key.push_back(2 if node_type is sequence else 3)
                for child in (node.items if node_type is sequence else node.options):
                    _append_int32(key, numbers.find(<PyObject*>child))
            elif node_type is repeat:
                minimum = node.minimum
                maximum = -1 if node.maximum is None else node.maximum
                child = node.item
                key.push_back(4)
                _append_int32(key, numbers.find(<PyObject*>child))
                _append_int32(key, minimum)
                _append_int32(key, maximum)
            elif node_type is reference:
                key.push_back(5)
                _append_int32(key, rule_number[node.name])
            elif node_type is exception:
                child = node.item
                key.push_back(6)
                _append_int32(key, numbers.find(<PyObject*>child))
                for value in node.excluded:  # each one's length first: the key reads back
                    _append_int32(key, len(value))
                    _append_bytes(key, value)
            elif node_type is minimized:
                child = node.item
                key.push_back(7)
                _append_int32(key, numbers.find(<PyObject*>child))
            else:
                raise TypeError(f"unknown grammar node {node_type.__name__}")
            number = by_value.find(key.data(), key.size())
            if number >= 0:
                numbers.insert(address, number)
                continue
            number = kind.size()
            numbers.insert(address, number)
            by_value.insert(key.data(), key.size(), number)
            _push_flat_node(key, node, kind, a, b, c, children, data, ranges)
        root_numbers.append(numbers.find(<PyObject*>root))
    return (
        PyBytes_FromStringAndSize(<char*>kind.data(), kind.size()),
        _int32_bytes(a),
        _int32_bytes(b),
        _int32_bytes(c),
        _int32_bytes(children),
        PyBytes_FromStringAndSize(<char*>data.data(), data.size()),
        _int32_bytes(ranges),
        root_numbers,
    )


cdef inline void _append_int32(string& key, int32_t value):
    key.append(<char*>&value, 4)


cdef inline void _append_bytes(string& key, bytes value):
    key.append(<const char*>value, len(value))


cdef inline int32_t _read_int32(const string& key, size_t at):
    cdef int32_t value
    memcpy(&value, key.data() + at, 4)
    return value


cdef void _push_flat_node(const string& key, object node, vector[int8_t]& kind,
                          vector[int32_t]& a, vector[int32_t]& b, vector[int32_t]& c,
                          vector[int32_t]& children, vector[uint8_t]& data,
                          vector[int32_t]& ranges) except *:
    """A new node's row of the flat arrays, read from its key (flatten_rules' layout)."""
    cdef int8_t node_kind = <int8_t>key[0]
    cdef size_t at, size = key.size()
    cdef int32_t length, k
    kind.push_back(node_kind)
    if node_kind == 0:  # a byte set: its (low, high) pairs
        a.push_back(ranges.size() // 2)
        for at in range(1, size):
            ranges.push_back(<uint8_t>key[at])
        b.push_back(ranges.size() // 2)
        c.push_back(0)
    elif node_kind == 1:  # a literal: its bytes
        a.push_back(data.size())
        for at in range(1, size):
            data.push_back(<uint8_t>key[at])
        b.push_back(data.size())
        c.push_back(0)
    elif node_kind == 2 or node_kind == 3:  # a sequence or a choice: its children's numbers
        a.push_back(children.size())
        for at in range(1, size, 4):
            children.push_back(_read_int32(key, at))
        b.push_back(children.size())
        c.push_back(0)
    elif node_kind == 4:  # a repeat: item, minimum, maximum (-1: unbounded)
        a.push_back(_read_int32(key, 1))
        b.push_back(_read_int32(key, 5))
        c.push_back(_read_int32(key, 9))
    elif node_kind == 6:  # an Except: its item, then (begin, end) of each excluded string in data
        a.push_back(_read_int32(key, 1))
        b.push_back(children.size())
        at = 5
        while at < size:
            length = _read_int32(key, at)
            at += 4
            children.push_back(data.size())
            for k in range(length):
                data.push_back(<uint8_t>key[at + k])
            at += length
            children.push_back(data.size())
        c.push_back(children.size())
    else:  # a reference (5: its rule) or a minimized item (7: the item)
        a.push_back(_read_int32(key, 1))
        b.push_back(0)
        c.push_back(0)

def trim_states(const int32_t[:, ::1] transitions, const int32_t[::1] extra_source,
                const int32_t[::1] extra_target, const uint8_t[::1] accepting,
                uint8_t[::1] live, uint8_t[::1] reachable):
    """Trimming's searches (see ``kernel.hpp``) into ``live`` and ``reachable``."""
    cdef int32_t states = transitions.shape[0]
    cdef int32_t extra = extra_source.shape[0]
    if transitions.shape[1] != 256 or accepting.shape[0] != states:
        raise ValueError("transitions must be (states, 256) and accepting (states,)")
    if live.shape[0] != states or reachable.shape[0] != states or extra_target.shape[0] != extra:
        raise ValueError("trim_states: arrays disagree in size")
    if states == 0:
        return
    cdef int32_t dummy = 0
    cdef const int32_t* source_pointer = &extra_source[0] if extra else &dummy
    cdef const int32_t* target_pointer = &extra_target[0] if extra else &dummy
    with nogil:
        trim_states_native(&transitions[0, 0], states, source_pointer, target_pointer, extra,
                           &accepting[0], &live[0], &reachable[0])


def refine_partition(const int32_t[:, ::1] targets, const int64_t[::1] labels, int rounds,
                     int32_t[::1] out):
    """Moore refinement (see ``kernel.hpp``) into ``out``; returns the number of blocks.
    ``rounds`` < 0 runs to the fixpoint. The GIL is released."""
    cdef int32_t states = targets.shape[0]
    cdef int32_t columns = targets.shape[1]
    if labels.shape[0] != states or out.shape[0] != states:
        raise ValueError("targets, labels and out disagree on the number of states")
    if states == 0:
        return 0
    cdef int32_t count
    with nogil:
        count = refine_partition_native(&targets[0, 0], states, columns, &labels[0], rounds, &out[0])
    return count


cdef class NativeTokenTable:
    """The usable tokens of one vocabulary as a depth-first trie. Building costs
    O(n log n) byte-string comparisons (about 0.1 s for 151k tokens)."""

    cdef TokenTable* table
    cdef readonly int vocabulary_size

    def __cinit__(
        self,
        const uint8_t[::1] data,
        const int64_t[::1] offsets,
        const int32_t[::1] lengths,
        const int32_t[::1] ids,
        int vocabulary_size,
    ):
        cdef int32_t count = ids.shape[0]
        cdef int64_t data_length = data.shape[0]
        cdef Py_ssize_t k
        if offsets.shape[0] != count or lengths.shape[0] != count or vocabulary_size < 0:
            raise ValueError("offsets, lengths and ids differ in length")
        for k in range(count):  # read unchecked by the trie: a bad one was a crash
            if not 0 <= ids[k] < vocabulary_size:
                raise ValueError(f"token id {ids[k]} is outside the vocabulary's {vocabulary_size}")
            if lengths[k] < 0 or offsets[k] < 0 or offsets[k] + lengths[k] > data_length:
                raise ValueError(f"token {ids[k]}'s bytes lie outside the data")
        cdef const uint8_t* data_pointer = &data[0] if data.shape[0] else NULL
        cdef const int64_t* offsets_pointer = &offsets[0] if count else NULL
        cdef const int32_t* lengths_pointer = &lengths[0] if count else NULL
        cdef const int32_t* ids_pointer = &ids[0] if count else NULL
        self.vocabulary_size = vocabulary_size
        with nogil:
            self.table = new_token_table(
                data_pointer, data_length, offsets_pointer, lengths_pointer, ids_pointer,
                count, vocabulary_size,
            )

    def __dealloc__(self):
        del self.table

    @property
    def node_count(self):
        return self.table.trie.node_count()

    @property
    def max_depth(self):
        return self.table.trie.max_depth


cdef int _flatten_configuration(object stacks, vector[int32_t]& flat,
                                int32_t state_count) except -1:
    """Append a configuration (a frozenset of state tuples) to ``flat`` as the kernel reads
    it: per stack, its length then its states (bottom first).

    Raises:
        ValueError: an empty stack, or a state outside the automaton's ``state_count`` made
            so far (a state key of another grammar: the kernel read past its tables, a
            segmentation fault or a mask of garbage)."""
    cdef tuple states
    cdef Py_ssize_t size, index
    cdef int32_t state
    for stack in stacks:
        states = <tuple>stack
        size = len(states)
        if size == 0:
            raise ValueError("a configuration holds an empty stack")
        flat.push_back(<int32_t>size)
        for index in range(size):
            state = states[index]
            if not 0 <= state < state_count:
                raise ValueError(
                    f"state {state} is outside this grammar's {state_count} states "
                    "(a parse state of another compiled grammar?)"
                )
            flat.push_back(state)
    return 0


cdef bint _is_same_configuration(Config& out, vector[int32_t]& flat):
    """Whether ``out`` holds the stacks of ``flat`` ([length, states...]*) in the same order."""
    cdef size_t cursor = 0, k, count = out.starts.size() - 1, length, position
    if out.data.size() + count != flat.size():
        return False
    for k in range(count):
        length = out.starts[k + 1] - out.starts[k]
        if <size_t>flat[cursor] != length:
            return False
        for position in range(length):
            if flat[cursor + 1 + position] != out.data[out.starts[k] + position]:
                return False
        cursor += length + 1
    return True


cdef class NativeMaskKernel:
    """Lazy per-state masks of one compiled grammar: a state's walk of the trie runs the first
    time a configuration reaches it, then is cached (bounded by ``cache_limit_bytes``)."""

    cdef MaskKernel* kernel
    cdef NativeTokenTable table
    cdef NativeAutomaton automaton  # the kernel shares it: kept for the Python side too
    cdef readonly int words
    cdef readonly dict steps  # (configuration, token id) -> step(): accept_token's cache
    cdef readonly Py_ssize_t step_cache_entries
    # The states the cached steps' configurations hold, and their bound: counted in entries
    # alone, 65,536 steps of a nested or ambiguous grammar's configurations held GBs (an
    # ambiguous nullable grammar: 1.4 GB after 1,000 tokens, 97 MB with 4 entries).
    cdef readonly Py_ssize_t step_cache_states
    cdef readonly Py_ssize_t step_cache_state_limit

    def __cinit__(
        self,
        NativeTokenTable table,
        NativeAutomaton automaton,
        const int32_t[::1] eos_ids,
        long long cache_limit_bytes,
        Py_ssize_t step_cache_entries=1 << 16,
        Py_ssize_t step_cache_state_limit=1 << 21,
    ):
        cdef int32_t dummy = 0
        self.steps = {}
        self.step_cache_entries = max(1, step_cache_entries)
        self.step_cache_states = 0
        self.step_cache_state_limit = max(1, step_cache_state_limit)
        cdef const int32_t* eos_pointer = &eos_ids[0] if eos_ids.shape[0] else &dummy
        self.table = table
        self.automaton = automaton
        self.words = table.table.words
        self.kernel = new_mask_kernel(
            table.table, automaton.automaton, eos_pointer, eos_ids.shape[0], cache_limit_bytes
        )

    def __dealloc__(self):
        del self.kernel

    def fill(self, stacks, bint can_end, uint32_t[::1] out):
        """Write the mask of the configuration ``stacks`` (a frozenset of state tuples) into
        ``out``; returns 0, :data:`STACK_LIMIT_EXCEEDED` or :data:`STATE_LIMIT_EXCEEDED`. The
        GIL is released for the
        fill (building the flat array in Python cost 1.5 µs of a 5.6 µs mask p50)."""
        if out.shape[0] < self.words:
            raise ValueError(f"the output has {out.shape[0]} words, the mask needs {self.words}")
        cdef vector[int32_t] flat
        cdef int status
        _flatten_configuration(stacks, flat, self.automaton.automaton.get().size())
        cdef int32_t empty = 0
        cdef const int32_t* flat_pointer = flat.data() if flat.size() else &empty
        with nogil:
            status = self.kernel.fill(flat_pointer, flat.size(), can_end, &out[0])
        return status

    def advance(self, stacks, bytes data):
        """The parser step of ``data`` from the closed configuration ``stacks`` (a frozenset
        of state tuples): ``(stacks, can_end)``, ``None`` if refused,
        :data:`STACK_LIMIT_EXCEEDED` or :data:`STATE_LIMIT_EXCEEDED`. The GIL is released for
        the step itself when it is long (token bytes x configuration size over 512)."""
        return self._advance_guarded(stacks, <const uint8_t*>data, len(data))

    def step(self, stacks, token):
        """:meth:`advance` by the bytes of token ``token`` (not a stop token), cached per
        (configuration, token): accept_token's step. ``None`` for a token the grammar refuses
        and for one without bytes or special (the token table leaves those out).

        Raises:
            IndexError: ``token`` is outside the vocabulary.
        Costs a dictionary lookup when cached (decoding meets the same configurations again:
        inside a string every character leaves it where it was), else the step. One C call:
        through two Python methods, a step not cached cost 1.42 µs (p50, MaskBench's steps),
        1.08 now; the cache is emptied once it holds ``step_cache_entries`` steps, or its
        new configurations ``step_cache_state_limit`` states (about 36 bytes each)."""
        return self.cached_step(stacks, token)

    cdef object cached_step(self, stacks, token):
        """:meth:`step` for C callers (:class:`MatcherCore`): no Python call in between."""
        key = (stacks, token)  # the caller's int object: no new one per call
        found = self.steps.get(key, _MISSING)
        if found is not _MISSING:
            return found
        cdef Py_ssize_t token_id = token
        cdef TokenTable* table = self.table.table
        if not 0 <= token_id < table.vocabulary_size:
            raise IndexError(f"token id {token_id} is outside the vocabulary")
        cdef int64_t offset = table.offsets[token_id]
        result = None
        if offset >= 0:
            result = self._advance_guarded(
                stacks, table.data.data() + offset, table.lengths[token_id]
            )
            if type(result) is int:
                return result  # a limit: not cached, the caller raises
        cdef Py_ssize_t states = 0
        if result is not None and (<tuple>result)[0] is not stacks:
            for stack in (<tuple>result)[0]:
                states += len(<tuple>stack)
        if (len(self.steps) >= self.step_cache_entries
                or self.step_cache_states + states > self.step_cache_state_limit):
            self.steps.clear()  # dict operations hold the GIL: no lock needed
            self.step_cache_states = 0
        self.steps[key] = result
        self.step_cache_states += states
        return result

    cdef object _advance_guarded(self, stacks, const uint8_t* pointer, int32_t length):
        cdef StepBuffers* buffers = &step_buffers()
        cdef StepBuffers* fresh = NULL
        if buffers.busy:
            fresh = new StepBuffers()
            buffers = fresh
        buffers.busy = True
        try:
            return self._advance(stacks, pointer, length, buffers)
        finally:
            buffers.busy = False
            del fresh

    cdef object _advance(self, stacks, const uint8_t* pointer, int32_t length,
                         StepBuffers* buffers):
        cdef int status
        cdef int32_t count, k, position
        cdef object value  # typed: an inferred C int would be a temporary at SET_ITEM
        cdef vector[int32_t]* flat = &buffers.flat
        cdef Config* out = &buffers.out
        flat.clear()
        _flatten_configuration(stacks, flat[0], self.automaton.automaton.get().size())
        if length * flat.size() <= 512:
            # A token of a few bytes on a few stacks is well under a microsecond: releasing
            # and taking back the GIL costs part of it (a cold accept 1.11 -> 1.05 µs).
            status = self.kernel.advance(flat.data(), flat.size(), pointer, length, out[0])
        else:
            with nogil:
                status = self.kernel.advance(flat.data(), flat.size(), pointer, length, out[0])
        if status == STACK_LIMIT_EXCEEDED or status == STATE_LIMIT_EXCEEDED:
            return status
        if status < 0:
            return None
        count = out.starts.size() - 1
        if _is_same_configuration(out[0], flat[0]):
            # Inside a string or a number most tokens leave the configuration as it was:
            # the caller's frozenset is the answer, with no tuples built or hashed.
            return stacks, status == 1
        result = []
        for k in range(count):
            stack = PyTuple_New(out.starts[k + 1] - out.starts[k])
            for position in range(out.starts[k], out.starts[k + 1]):
                value = out.data[position]
                Py_INCREF(value)
                PyTuple_SET_ITEM(stack, position - out.starts[k], value)
            result.append(stack)
        return frozenset(result), status == 1

    def is_walked(self, int state):
        """Whether ``state``'s walk is cached."""
        return self.kernel.is_walked(state)

    def statistics(self):
        """``dict`` of the walks so far: states walked, unique masks, escape entries and
        checks, the bytes the caches hold, the states whose walks take closed subtrees
        of the vocabulary's trie whole (a string's content and its UTF-8 states) and the byte
        transitions in the tables of the pieces they took, and the
        walks that took their short tokens from an alike state (a counted string's
        positions) or from a bounded piece (a counted string's first position)."""
        cdef KernelStatistics stats = self.kernel.statistics()
        return {
            "states_walked": stats.states_walked,
            "unique_masks": stats.unique_masks,
            "escape_entries": stats.escape_entries,
            "escape_checks": stats.escape_checks,
            "memory_bytes": stats.memory_bytes,
            "closed_states": stats.closed_states,
            "piece_transitions": stats.piece_transitions,
            "alike_walks": stats.alike_walks,
            "bounded_walks": stats.bounded_walks,
        }


include "matcher_core.pxi"

def copy_mask(const uint32_t[::1] words, int32_t[::1] row):
    """``row[:len(words)] = words``, the rest of ``row`` zeroed: one step's fill (numpy's two
    slice assignments cost 2 µs of a 5.6 µs mask p50 on Llama-3's 4,008 words)."""
    cdef Py_ssize_t width = min(words.shape[0], row.shape[0])
    cdef Py_ssize_t word
    with nogil:
        for word in range(width):
            row[word] = <int32_t>words[word]
        for word in range(width, row.shape[0]):
            row[word] = 0


def copy_mask_row(const uint32_t[::1] words, int32_t[:, ::1] bitmask, Py_ssize_t index):
    """``bitmask[index] = words`` (the rest of the row zeroed) for a writable C-contiguous
    int32 bitmask of rows at least as wide as ``words``; raises ``ValueError`` (a buffer of
    another kind, a narrow row, a row outside) for the caller's checked path to explain.
    One call with the buffer checks in C: a cached step's fill 2.3 -> 1.3 µs on Llama-3."""
    if not 0 <= index < bitmask.shape[0] or bitmask.shape[1] < words.shape[0]:
        raise ValueError("not a row of this bitmask")
    cdef Py_ssize_t width = words.shape[0]
    cdef Py_ssize_t word
    with nogil:
        for word in range(width):
            bitmask[index, word] = <int32_t>words[word]
        for word in range(width, bitmask.shape[1]):
            bitmask[index, word] = 0


def fill_masks(list kernels, list configurations, list can_ends, list outputs, int threads):
    """Write the mask of ``configurations[k]`` (a frozenset of state tuples) under
    ``kernels[k]`` into ``outputs[k]`` (uint32 words) for every k, on ``threads`` native
    threads with the GIL released throughout: the states they need walked first (widest
    first, each once), then the fills (``batch.hpp``). Returns 0 or
    :data:`STACK_LIMIT_EXCEEDED`.

    Raises:
        ValueError: the lists differ in length or an output is shorter than its mask.
        MemoryError: a walk ran out of memory."""
    cdef Py_ssize_t count = len(kernels), k
    if not (len(configurations) == len(can_ends) == len(outputs) == count):
        raise ValueError("kernels, configurations, can_ends and outputs differ in length")
    cdef BatchFill job
    cdef vector[int32_t] flat
    cdef uint32_t[::1] out
    cdef NativeMaskKernel kernel
    cdef int status
    for k in range(count):
        kernel = kernels[k]
        out = outputs[k]
        if out.shape[0] < kernel.words:
            raise ValueError(f"output {k} has {out.shape[0]} words, the mask needs {kernel.words}")
        flat.clear()
        _flatten_configuration(
            configurations[k], flat, kernel.automaton.automaton.get().size()
        )
        job.add(kernel.kernel, move(flat), <cpp_bool>can_ends[k], &out[0])
    with nogil:
        status = job.run(max(1, threads))
    return status


def prepare_helpers(int threads):
    """Wake ``threads - 1`` of the batch fill's helper threads now (made on first use), so
    that they are running when :func:`fill_masks` hands them work: on a 2-core VM a woken
    thread began 80-120 µs after its wake, about what a 64-row batch's Python part takes
    (``pool.hpp``). They take the jobs that come until :func:`release_helpers`, and park
    after 2 ms without one. Costs a futex wake."""
    if threads > 1:
        with nogil:
            HelperPool.shared().prepare(threads - 1)


def release_helpers(int threads):
    """Undo :func:`prepare_helpers` with the same ``threads``: once no batch holds them, the
    helpers park when idle. Costs an atomic add."""
    if threads > 1:
        HelperPool.shared().release()


def helper_threads():
    """How many helper threads this process's batch pool has made: at most one fewer than
    the CPUs it may use; none yet in a forked child, whatever its parent made."""
    return HelperPool.shared().helper_count()


def spin_mutex_count(int threads, int rounds, int hold_every=0, int hold_microseconds=0):
    """The tests' check of the batch's locks (``spin_mutex.hpp``): ``threads`` threads each
    add 1 ``rounds`` times to a plain counter under one lock, every ``hold_every``-th time
    holding it ``hold_microseconds`` (so a waiter gives up spinning and sleeps). Returns the
    counter, ``threads * rounds`` when the lock excludes. Costs the threads' rounds."""
    cdef int64_t counted
    with nogil:
        counted = count_under_spin_mutex(threads, rounds, hold_every, hold_microseconds)
    return counted


def copy_masks(list sources, int32_t[:, ::1] bitmask, const int64_t[::1] rows, int threads=1):
    """``bitmask[rows[k]] = sources[k]`` for a list of 1-D uint32 masks (words past a source
    zeroed): one call for a batch, the copies without the GIL (a call per row cost 1.5 µs
    of buffer handling, more than the 16 KiB copy itself), on ``threads`` threads (the
    calling one and the batch's helpers: worth it only while :func:`prepare_helpers` holds
    them, or a wake costs more than the copy)."""
    cdef Py_ssize_t count = len(sources)
    if rows.shape[0] != count:
        raise ValueError(f"{count} masks but {rows.shape[0]} rows")
    cdef vector[const uint32_t*] pointers
    cdef vector[int64_t] widths
    cdef const uint32_t[::1] view
    cdef Py_ssize_t k, row
    cdef Py_ssize_t columns = bitmask.shape[1]
    for k in range(count):
        view = sources[k]
        row = rows[k]
        if not (0 <= row < bitmask.shape[0]):
            raise ValueError(f"row {row} is outside the bitmask's {bitmask.shape[0]} rows")
        pointers.push_back(&view[0] if view.shape[0] else NULL)
        widths.push_back(min(view.shape[0], columns))
    # memcpy per row: the word loop through the 2-D view was not vectorised (64 rows of
    # Llama-3's 4,008 words from one mask: 21 -> 12 µs; a cold 64-row batch's 30 masks
    # 25 -> 20 µs).
    if columns == 0 or count == 0:
        return  # no row to write (and &bitmask[0, 0] would point past it)
    with nogil:
        copy_rows(pointers.data(), widths.data(), &bitmask[0, 0], columns, &rows[0],
                  <size_t>count, max(1, threads))


def apply_bitmask(
    logit_bits[:, ::1] logits,
    const uint32_t[:, ::1] bitmask,
    const int64_t[::1] logit_rows,
    const int64_t[::1] mask_rows,
    int64_t width,
    logit_bits negative_infinity,
):
    """Set ``logits[logit_rows[k], t]`` to ``negative_infinity`` (the bit pattern of minus
    infinity in the logits' float type, which ``logits`` holds as unsigned integers of its
    width) for every token ``t`` that row ``mask_rows[k]`` of ``bitmask`` refuses, and for
    every ``t`` at or past ``width`` (``apply.hpp``), without the GIL.

    Raises:
        ValueError: the row lists differ in length or name a row out of range.
    Costs one pass over the selected rows' mask words plus a store per refused token."""
    cdef Py_ssize_t count = logit_rows.shape[0], k
    if mask_rows.shape[0] != count:
        raise ValueError(f"{count} logit rows but {mask_rows.shape[0]} mask rows")
    for k in range(count):
        if not 0 <= logit_rows[k] < logits.shape[0]:
            raise ValueError(f"row {logit_rows[k]} is outside the logits' {logits.shape[0]} rows")
        if not 0 <= mask_rows[k] < bitmask.shape[0]:
            raise ValueError(f"row {mask_rows[k]} is outside the bitmask's {bitmask.shape[0]} rows")
    if count == 0 or logits.shape[1] == 0:
        return
    cdef const uint32_t* words = &bitmask[0, 0] if bitmask.shape[1] else NULL
    with nogil:
        apply_bitmask_rows(
            &logits[0, 0], logits.shape[1], words, bitmask.shape[1], &logit_rows[0],
            &mask_rows[0], count, width, negative_infinity,
        )

