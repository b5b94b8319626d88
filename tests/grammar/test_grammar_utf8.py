"""Code point sets as UTF-8 byte sequences: exactly the encodings of the set, and an automaton
built at its minimal size (shared continuation tails)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from formline.grammar import Grammar
from formline.grammar.utf8 import MAX_CODE_POINT, SURROGATES, code_points_to_node
from formline.parser.pushdown import build_pushdown, build_pushdown_reference
from formline.schema.patterns import any_json_character, length_node

# Where the encoding length or a continuation byte's range changes.
BOUNDARIES = (0, 0x7F, 0x80, 0x7FF, 0x800, 0xFFF, 0x1000, 0xD7FF, 0xE000, 0xFFFF, 0x10000)
BOUNDARIES += (0x3FFFF, 0x40000, 0xFFFFF, 0x100000, MAX_CODE_POINT)


def accepts(node_grammar: Grammar, data: bytes) -> bool:
    automaton = build_pushdown(node_grammar)
    state = automaton.start
    for byte in data:
        state = int(automaton.transitions[state, byte])
        if state < 0:
            return False
    return bool(automaton.accepting[state])


code_point = st.one_of(st.sampled_from(BOUNDARIES), st.integers(0, MAX_CODE_POINT))
code_ranges = st.lists(
    st.tuples(code_point, st.integers(0, 70_000)).map(
        lambda pair: (pair[0], min(MAX_CODE_POINT, pair[0] + pair[1]))
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=60, deadline=None)
@given(code_ranges, st.lists(code_point, max_size=8))
def test_a_set_accepts_exactly_the_encodings_of_its_code_points(ranges, extra):
    grammar = Grammar({"root": code_points_to_node(ranges)})
    probes = set(extra) | set(BOUNDARIES)
    for low, high in ranges:
        probes |= {low - 1, low, (low + high) // 2, high, high + 1}
    for probe in sorted(probe for probe in probes if 0 <= probe <= MAX_CODE_POINT):
        if SURROGATES[0] <= probe <= SURROGATES[1]:
            # An encoded surrogate is not UTF-8: refused whatever the set says.
            assert not accepts(grammar, chr(probe).encode("utf-8", "surrogatepass"))
            continue
        expected = any(low <= probe <= high for low, high in ranges)
        assert accepts(grammar, chr(probe).encode()) == expected, (ranges, hex(probe))


def test_overlong_and_truncated_sequences_are_refused():
    grammar = Grammar({"root": code_points_to_node([(0, MAX_CODE_POINT)])})
    for data in (b"\xc0\x80", b"\xe0\x80\x80", b"\xf0\x80\x80\x80", b"\xe2\x82", b"\xff"):
        assert not accepts(grammar, data), data


def test_a_json_string_character_is_determinised_at_its_minimal_size():
    # Leads with one tail share it, and subsets are told apart by their important states:
    # the subset construction gave 26 states for one character before, 15 of them needed.
    for node in (any_json_character(), length_node(0, None), length_node(2, 5)):
        lazy = build_pushdown(Grammar({"root": node}))
        lazy.tables()  # every state made
        assert lazy.size == build_pushdown_reference(Grammar({"root": node})).size
