"""The native automaton build (flattened IR -> Thompson NFAs -> DFAs -> trimmed, minimised,
linked, in the kernel) against the Python builder, on random grammars and real schemas."""

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from minimal_automaton import canonical, minimized

from formline.automata import AutomatonLimitError
from formline.grammar.budget import CompileLimitError, Deadline
from formline.grammar.ir import (
    ByteSet,
    Choice,
    Except,
    Grammar,
    GrammarError,
    Literal,
    Minimized,
    Node,
    Repeat,
    RuleReference,
    Sequence,
    flatten,
)
from formline.parser.pushdown import (
    build_pushdown,
    build_pushdown_reference,
    recursive_rules,
)
from formline.schema import SchemaError, schema_to_grammar

MASKBENCH = Path(__file__).resolve().parents[1] / "data" / "maskbench"


def assert_same_automaton(grammar: Grammar) -> None:
    try:
        reference = build_pushdown_reference(grammar)
    except GrammarError as error:
        with pytest.raises(GrammarError) as caught:
            build_pushdown(grammar)
        assert type(caught.value) is type(error)
        assert str(caught.value) == str(error)
        return
    native = build_pushdown(grammar)
    # The start first, then the called rules the DFAs may enter: those the reference's NFAs
    # reach, or (a build that makes NFAs as they are needed) every called rule the start's
    # references reach, whether or not an NFA path gets there.
    assert native.rule_names[0] == reference.rule_names[0]
    assert set(reference.rule_names) <= set(native.rule_names)
    called = recursive_rules(grammar) | grammar.called_rules
    assert set(native.rule_names) <= {grammar.start} | called
    assert canonical(minimized(native)) == canonical(reference)


def leaves() -> st.SearchStrategy[Node]:
    byte_sets = st.lists(
        st.tuples(st.integers(97, 100), st.integers(0, 2)), min_size=0, max_size=2
    ).map(lambda pairs: ByteSet(tuple((low, low + width) for low, width in pairs)))
    literals = st.text("abcd", max_size=3).map(lambda text: Literal(text.encode()))
    references = st.sampled_from(["r0", "r1", "r2"]).map(RuleReference)
    return st.one_of(byte_sets, literals, references)


def trees() -> st.SearchStrategy[Node]:
    return st.recursive(
        leaves(),
        lambda inner: st.one_of(
            st.lists(inner, max_size=3).map(lambda items: Sequence(tuple(items))),
            st.lists(inner, min_size=1, max_size=3).map(lambda items: Choice(tuple(items))),
            st.tuples(inner, st.integers(0, 2), st.one_of(st.none(), st.integers(0, 3))).map(
                lambda case: Repeat(
                    case[0], case[1], None if case[2] is None else case[1] + case[2]
                )
            ),
            st.tuples(inner, st.lists(st.binary(max_size=3), max_size=4)).map(
                lambda case: Except(case[0], tuple(case[1]))
            ),
            # Equal items recur across examples: later builds take the minimal DFA that
            # the first made (shared between builds by the item's content).
            inner.map(Minimized),
        ),
        max_leaves=8,
    )


@given(st.lists(trees(), min_size=4, max_size=4))
@settings(max_examples=150, deadline=None)
def test_native_rule_automata_equal_the_python_builder(bodies) -> None:
    # Every rule is called (recursion through call edges is fine, no inlining cycles), and
    # the root also inlines nothing: it only calls.
    rules = {"root": bodies[0], "r0": bodies[1], "r1": bodies[2], "r2": bodies[3]}
    assert_same_automaton(Grammar(rules, "root", called_rules=frozenset({"r0", "r1", "r2"})))


# 400 literals: a root past the kernel's threshold for building the NFAs on two threads
# (lazy_build.hpp's kParallelBuildNodes).
WIDE_ROOT = Choice(tuple(Literal(b"w%03d" % index) for index in range(400)))


@given(st.lists(trees(), min_size=8, max_size=8))
@settings(max_examples=60, deadline=None)
def test_rules_built_on_two_threads_equal_the_python_builder(bodies) -> None:
    # Eight called rules of a root wide enough for the two-thread build: the same automaton
    # or the same error (a failure is the one a single thread's discovery meets first).
    rules = {f"r{index}": body for index, body in enumerate(bodies[:7])}
    rules["root"] = Choice((WIDE_ROOT, bodies[7], *(RuleReference(name) for name in rules)))
    assert len(flatten(rules).kind) >= 400
    assert_same_automaton(Grammar(rules, "root", called_rules=frozenset(rules) - {"root"}))


def test_wide_grammars_built_on_two_python_threads_at_once_agree() -> None:
    # One build holds the helper, the other finds it busy and builds alone (pool.hpp's
    # alone_when_busy): both give the Python builder's automaton, every time.
    items = [Repeat(Literal(b"abc"), 0, 40), Choice((Literal(b"x"), RuleReference("r0")))]
    rules: dict[str, Node] = {
        f"r{index}": Sequence((Literal(b"%d" % index), items[0])) for index in range(6)
    }
    rules["root"] = Choice((WIDE_ROOT, items[1], *(RuleReference(name) for name in rules)))
    grammar = Grammar(rules, "root", called_rules=frozenset(rules) - {"root"})
    expected = canonical(build_pushdown_reference(grammar))
    results: list[object] = []
    start = threading.Barrier(2)

    def build_many() -> None:
        start.wait()
        for _ in range(20):
            results.append(canonical(minimized(build_pushdown(grammar))))

    workers = [threading.Thread(target=build_many) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert len(results) == 40
    assert all(result == expected for result in results)


def test_a_failure_of_the_two_thread_build_names_the_rule_one_thread_meets_first() -> None:
    # Two called rules past the kernel's NFA limit (inlined references count once in the
    # estimate before it); an unreferenced rule of 400 literals takes the grammar past the
    # two-thread threshold without changing what the start reaches. One thread's discovery
    # meets r4 first (the start's callees are taken last first).
    rules: dict[str, Node] = {f"r{index}": Literal(b"%d" % index) for index in range(6)}
    rules["big"] = Literal(b"x" * 30)
    rules["r1"] = Sequence(tuple(RuleReference("big") for _ in range(10)))
    rules["r4"] = Sequence(tuple(RuleReference("big") for _ in range(12)))
    rules["root"] = Sequence(tuple(RuleReference(f"r{index}") for index in range(6)))
    called = frozenset(f"r{index}" for index in range(6))
    with pytest.raises(AutomatonLimitError, match="rule 'r4'") as alone:
        build_pushdown(Grammar(rules, "root", called_rules=called), nfa_state_limit=200)
    wide = Grammar({**rules, "zz_pad": WIDE_ROOT}, "root", called_rules=called)
    assert len(flatten(wide.rules).kind) >= 400
    for _ in range(10):
        with pytest.raises(AutomatonLimitError) as caught:
            build_pushdown(wide, nfa_state_limit=200)
        assert str(caught.value) == str(alone.value)


def test_native_trim_drops_dead_branches_and_calls_that_derive_nothing() -> None:
    # r0 is live throughout (its NFA is kept as built); r1 has a branch through an empty
    # byte class and one through r2, which derives nothing: both are trimmed away.
    rules = {
        "root": Sequence((RuleReference("r0"), RuleReference("r1"))),
        "r0": Literal(b"ab"),
        "r1": Choice(
            (
                Literal(b"c"),
                Sequence((ByteSet(()), Literal(b"d"))),
                Sequence((RuleReference("r2"), Literal(b"e"))),
            )
        ),
        "r2": Sequence((Literal(b"x"), RuleReference("r2"))),
    }
    grammar = Grammar(rules, "root", called_rules=frozenset({"r0", "r1", "r2"}))
    assert_same_automaton(grammar)
    automaton = build_pushdown(grammar)
    assert "r2" not in automaton.rule_names
    # r2 derives nothing: the build makes every NFA now, to trim the calls into it.
    assert automaton.native.rules_built == 3
    assert [automaton.matches(text) for text in (b"abc", b"abd", b"abxe")] == [True, False, False]


def test_a_rule_is_built_when_a_step_first_enters_it() -> None:
    # Every rule surely derives a string and none calls itself before a byte: the build
    # makes the start's NFA alone, and each other rule's when a state calling it is first
    # made (expanding the state after "a" makes the one after "ax", which calls r0).
    rules = {
        "root": Choice(
            (
                Sequence((Literal(b"ax"), RuleReference("r0"))),
                Sequence((Literal(b"by"), RuleReference("r1"))),
            )
        ),
        "r0": Sequence((Literal(b"x"), Repeat(RuleReference("r0"), 0, 1))),
        "r1": Except(Repeat(ByteSet(((97, 122),)), 1, None), (b"no",)),
    }
    grammar = Grammar(rules, "root", called_rules=frozenset({"r0", "r1"}))
    automaton = build_pushdown(grammar)
    assert automaton.native.rules_built == 1
    assert automaton.matches(b"axxx")
    assert automaton.native.rules_built == 2
    assert [automaton.matches(text) for text in (b"byno", b"bynon", b"by")] == [False, True, False]
    assert automaton.native.rules_built == 3
    assert_same_automaton(grammar)


def test_a_lazy_automaton_counts_what_it_keeps_to_make_its_waiting_rules() -> None:
    # r0 waits until a state enters it; until then the automaton keeps the flat IR to make
    # it from, its 20,800-byte literal included, and memory_bytes (what a compiler's cache
    # bounded in bytes reads) says so: three DFA states' rows alone are about 3 KB.
    text = bytes(range(97, 123)) * 800
    rules = {
        "root": Choice((Sequence((Literal(b"a"), RuleReference("r0"))), Literal(b"b"))),
        "r0": Literal(text),
    }
    automaton = build_pushdown(Grammar(rules, "root", called_rules=frozenset({"r0"})))
    assert automaton.native.rules_built == 1
    assert automaton.memory_bytes() > len(text)
    assert automaton.matches(b"a" + text) and automaton.native.rules_built == 2


def test_rules_made_by_two_threads_at_once_agree() -> None:
    # Twelve called rules, each waiting for its first state: two threads read the same new
    # automaton at once, in opposite orders (a row is expanded without the GIL, a rule's NFA
    # made under the automaton's mutex), and both read the language one thread reads.
    letters = "abcdefghijkl"
    rules: dict[str, Node] = {
        f"r{letter}": Sequence(
            (Literal(b"<" + letter.encode()), Repeat(ByteSet(((48, 57),)), 0, None))
        )
        for letter in letters
    }
    rules["root"] = Choice(
        tuple(
            Sequence((Literal(letter.encode()), RuleReference(f"r{letter}"))) for letter in letters
        )
    )
    grammar = Grammar(rules, "root", called_rules=frozenset(rules) - {"root"})
    texts = [f"{x}<{y}{digits}".encode() for x in letters for y in letters for digits in ("", "42")]
    expected = [text[0] == text[2] for text in texts]
    for _ in range(20):
        automaton = build_pushdown(grammar)
        assert automaton.native.rules_built == 1
        answers: dict[int, list[bool]] = {}
        start = threading.Barrier(2)

        def read(order: int, automaton=automaton, answers=answers, start=start) -> None:
            start.wait()
            ordered = texts if order == 0 else texts[::-1]
            found = [automaton.matches(text) for text in ordered]
            answers[order] = found if order == 0 else found[::-1]

        workers = [threading.Thread(target=read, args=(order,)) for order in range(2)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=60)
        assert answers == {0: expected, 1: expected}
        assert automaton.native.rules_built == 1 + len(letters)


@given(trees(), trees())
@settings(max_examples=100, deadline=None)
def test_native_inlining_equals_the_python_builder(root, inlined) -> None:
    # r0 holds no reference of its own here, so it can be inlined into the root.
    leaf_only = (
        inlined
        if not any(isinstance(n, RuleReference) for n in _nodes(inlined))
        else (Literal(b"ab"))
    )
    rules = {"root": root, "r0": leaf_only, "r1": Literal(b"c"), "r2": ByteSet(((97, 98),))}
    assert_same_automaton(Grammar(rules, "root", called_rules=frozenset({"r1", "r2"})))


def test_a_minimized_item_shared_between_grammars_keeps_each_context() -> None:
    # One number-like item in two grammars that differ around it (and in node numbering):
    # the second build takes the first's minimal DFA and must still mean its own grammar.
    digits = Repeat(ByteSet(((48, 57),)), 1, None)
    item = Minimized(Sequence((Repeat(Literal(b"-"), 0, 1), digits)))
    first = Grammar({"root": Sequence((Literal(b"["), item, Literal(b"]")))}, "root")
    second = Grammar(
        {
            "root": Choice((Literal(b"x"), Sequence((item, Literal(b","), RuleReference("r0"))))),
            "r0": Sequence((Literal(b"{"), item, Literal(b"}"))),
        },
        "root",
        called_rules=frozenset({"r0"}),
    )
    for grammar in (first, second, first, second):
        assert_same_automaton(grammar)


def test_an_automaton_built_after_a_freed_one_reads_none_of_its_states() -> None:
    # A freed automaton's per-state arrays are kept by the thread (native MappedArrayPool)
    # and handed to the next build zeroed over the states it made: a made row, an accepting
    # or a special flag of the first may not show through in the second.
    first = build_pushdown(
        Grammar(
            {
                "root": Sequence((Literal(b"{"), RuleReference("item"), Literal(b"}"))),
                "item": Choice(
                    (
                        Repeat(ByteSet(((97, 122),)), 1, 40),
                        Sequence((Literal(b"("), RuleReference("item"), Literal(b")"))),
                    )
                ),
            },
            "root",
            called_rules=frozenset({"item"}),
        )
    )
    first.tables()  # every state made: about 40 rows, flags and calls
    assert first.size > 30
    del first
    second = Grammar({"root": Sequence((Repeat(Literal(b"ab"), 0, 3), ByteSet(((48, 57),))))})
    assert_same_automaton(second)


def _nodes(node: Node) -> list[Node]:
    found = [node]
    for child in node.children():
        found.extend(_nodes(child))
    return found


def test_native_rule_automata_equal_the_python_builder_on_maskbench() -> None:
    compared = 0
    for path in sorted(MASKBENCH.glob("*.json"))[::20]:
        try:
            grammar, _ = schema_to_grammar(json.loads(path.read_text())["schema"])
        except SchemaError:
            continue  # declined schemas: their errors are tested in tests/schema
        assert_same_automaton(grammar)
        compared += 1
    assert compared >= 12


def test_native_nfa_limit_is_an_error() -> None:
    # An inlined reference counts once in the estimate, so the kernel's counter stops this.
    body = Sequence(tuple(RuleReference("r0") for _ in range(10)))
    grammar = Grammar({"root": body, "r0": Literal(b"x" * 30)})
    with pytest.raises(AutomatonLimitError, match="more than 100 NFA states") as caught:
        build_pushdown(grammar, nfa_state_limit=100)
    assert caught.value.limit == "nfa_states"


def test_a_rule_past_the_nfa_limit_is_refused_at_compile_even_where_rules_wait() -> None:
    # r0 is called and inlines `big`, whose NFA is far past the limit: the state bound
    # (10^7 copies of a bound near 2^40, saturated, not wrapped into a small number) keeps
    # r0 from waiting for its first state, so the compile names it, as the eager build does.
    count = 10**7
    big = Repeat(Repeat(Repeat(Literal(b"a"), 0, count), 0, count), 0, count)
    rules = {
        "root": Sequence((Literal(b"x"), RuleReference("r0"))),
        "r0": Sequence((Literal(b"y"), RuleReference("big"))),
        "big": big,
    }
    grammar = Grammar(rules, "root", called_rules=frozenset({"r0"}))
    with pytest.raises(AutomatonLimitError, match="more than 1000 NFA states \\(rule 'r0'"):
        build_pushdown(grammar, nfa_state_limit=1000)


def test_native_dfa_limit_bounds_the_states_made() -> None:
    # (a|b)*a(a|b){12} needs 2^13 DFA states: the build makes the start only, a text makes
    # a state per byte at most, and making them all passes the limit: an error, and the
    # automaton stays refused (its rows are dead ends past the limit).
    either = ByteSet(((97, 98),))
    body = Sequence((Repeat(either), Literal(b"a"), Repeat(either, 12, 12)))
    automaton = build_pushdown(Grammar({"root": body}), dfa_state_limit=500)
    assert automaton.size == 1
    stacks, _ = automaton.initial()
    result = automaton.advance(stacks, b"ba" * 20 + b"a" + b"b" * 12)
    assert result is not None and result[1] and automaton.size <= 60
    with pytest.raises(AutomatonLimitError, match="more than 500 DFA states") as caught:
        automaton.tables()
    assert caught.value.limit == "dfa_states" and automaton.size == 500
    with pytest.raises(AutomatonLimitError):
        automaton.advance(stacks, b"ab" * 30)


def test_native_build_stops_at_the_deadline() -> None:
    grammar = Grammar({"root": Repeat(ByteSet(((97, 122),)), 0, 100_000)})
    passed = Deadline(time.monotonic() - 1, 0.5)
    started = time.perf_counter()
    with pytest.raises(CompileLimitError, match=r"time budget of 0\.5 s") as caught:
        build_pushdown(grammar, deadline=passed)
    assert caught.value.limit == "seconds"
    assert time.perf_counter() - started < 1.0


def test_native_build_names_left_recursion_and_empty_grammars() -> None:
    left = Grammar.from_ebnf('root ::= list\nlist ::= list "," item | item\nitem ::= "x"')
    with pytest.raises(GrammarError, match="left recursion is not supported: list -> list"):
        build_pushdown(left)
    never = Grammar(
        {
            "root": Sequence((Literal(b"a"), RuleReference("loop"))),
            "loop": Sequence((Literal(b"b"), RuleReference("loop"))),
        }
    )
    with pytest.raises(GrammarError, match="matches no string"):
        build_pushdown(never)


def test_flattening_numbers_a_shared_subtree_once() -> None:
    shared = Sequence((Literal(b"ab"), ByteSet(((48, 57),))))
    grammar = Grammar({"root": Sequence((shared, shared, Repeat(shared, 2, 3)))})
    flat = flatten(grammar.rules)
    assert len(flat.kind) == 5  # literal, byte set, shared sequence, repeat, root
    assert np.count_nonzero(flat.kind == 2) == 2
