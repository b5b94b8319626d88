"""Numeric bounds as grammar IR: accepted iff in range, for plain decimals and integers.

Every node is compiled with the real pushdown builder and checked on JSON texts against the
exact decimal value (``Decimal(text)``). Exponent forms are checked as the module documents:
never accepted out of range; accepted in range when normalized (``1e-05``, ``2.5e-07``), a
zero mantissa, or when the side of the range (sign) is unbounded away from 0.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from formline.grammar.ir import Grammar, walk
from formline.parser.pushdown import PushdownAutomaton, build_pushdown
from formline.schema import schema_to_grammar
from formline.schema.numbers import integer_bounds_from_schema, integer_node, number_node

NumberBounds = tuple[Decimal | None, Decimal | None, bool, bool]
IntegerBounds = tuple[int | None, int | None]

JSON_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
ALWAYS_ACCEPTED_EXPONENT = re.compile(r"-?([1-9](\.[0-9]+)?|0(\.0+)?)[eE][+-]?[0-9]+")
# fmt: off
NOT_NUMBERS = ["", "-", "01", "-01", "00", "1.", ".5", "-.5", "+1", "--1", "1e", "1e+", "1.e5",
               "e5", "0x1", " 1", "1 ", "1.5.5", "NaN", "Infinity", "1_0", "١"]
# fmt: on
SETTINGS = settings(max_examples=120, deadline=None)


@cache
def number_automaton(bounds: NumberBounds) -> PushdownAutomaton:
    return build_pushdown(Grammar({"root": number_node(*bounds)}))


@cache
def integer_automaton(bounds: IntegerBounds) -> PushdownAutomaton:
    return build_pushdown(Grammar({"root": integer_node(*bounds)}))


def matches(automaton: PushdownAutomaton, text: str) -> bool:
    """Whether ``text`` is a complete match (not just a prefix)."""
    stacks, can_end = automaton.initial()
    if not text:
        return can_end
    result = automaton.advance(stacks, text.encode("utf-8"))
    return result is not None and result[1]


def in_range(value: Decimal, bounds: NumberBounds) -> bool:
    low, high, low_exclusive, high_exclusive = bounds
    above = low is None or value > low or (value == low and not low_exclusive)
    return above and (high is None or value < high or (value == high and not high_exclusive))


def expected(text: str, bounds: NumberBounds) -> bool | None:
    """True/False where the module promises an answer; None where either is allowed."""
    if not JSON_NUMBER.fullmatch(text) or not in_range(Decimal(text), bounds):
        return False
    if "e" not in text.lower() or ALWAYS_ACCEPTED_EXPONENT.fullmatch(text):
        return True
    low, high, _, _ = bounds
    if text.startswith("-"):
        side_unbounded = low is None and (high is None or high >= 0)
    else:
        side_unbounded = high is None and (low is None or low <= 0)
    return True if side_unbounded else None


def plain_texts(value: Decimal) -> list[str]:
    """The plain JSON text of ``value`` and the same with trailing zeros."""
    text = format(value, "f")
    return [text, text + ("00" if "." in text else ".0")]


def near(bound: Decimal | None) -> list[Decimal]:
    if bound is None:
        return []
    steps = [Decimal(1).scaleb(-places) for places in range(5)]
    return [bound, *(bound + step for step in steps), *(bound - step for step in steps)]


def check_number_texts(bounds: NumberBounds, texts: list[str]) -> None:
    automaton = number_automaton(bounds)
    for text in texts:
        answer = expected(text, bounds)
        if answer is not None:
            assert matches(automaton, text) == answer, (text, bounds)


small_decimals = st.decimals(min_value=-1000, max_value=1000, places=3)
tiny_decimals = st.decimals(min_value=Decimal("-0.01"), max_value=Decimal("0.01"), places=6)
bound_values = st.one_of(
    st.integers(-1000, 1000).map(Decimal),
    small_decimals,
    tiny_decimals,
    st.sampled_from([Decimal(0), Decimal("0.5"), Decimal(1), Decimal(-1), Decimal(10)]),
)


@st.composite
def number_bounds(draw: st.DrawFn) -> NumberBounds:
    low, high = draw(st.none() | bound_values), draw(st.none() | bound_values)
    if low is not None and high is not None and low > high:
        low, high = high, low
    low_exclusive, high_exclusive = draw(st.booleans()), draw(st.booleans())
    if low is not None and low == high:
        low_exclusive = high_exclusive = False
    return (low, high, low_exclusive, high_exclusive)


exponent_texts = st.builds(
    lambda sign, integer, fraction, mark, exponent_sign, exponent: (
        f"{sign}{integer}{'.' + fraction if fraction else ''}{mark}{exponent_sign}{exponent}"
    ),
    st.sampled_from(["", "-"]),
    st.one_of(st.integers(1, 9).map(str), st.just("0"), st.integers(10, 999).map(str)),
    st.none() | st.text("0123456789", min_size=1, max_size=4),
    st.sampled_from(["e", "E"]),
    st.sampled_from(["", "+", "-"]),
    st.one_of(st.integers(0, 12).map(str), st.integers(0, 12).map(lambda n: f"{n:02d}")),
)
float_texts = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(min_value=-1e-3, max_value=1e-3),
    st.floats(min_value=-2000, max_value=2000),
).map(json.dumps)


@SETTINGS
@given(number_bounds(), st.lists(st.decimals(places=6, min_value=-3000, max_value=3000)))
def test_plain_decimals_are_accepted_exactly_when_in_range(
    bounds: NumberBounds, values: list[Decimal]
) -> None:
    candidates = [*values, *near(bounds[0]), *near(bounds[1]), Decimal(0), Decimal("-0")]
    texts = [text for value in candidates for text in plain_texts(value)]
    texts += [str(value) for value in range(-3, 4)]
    check_number_texts(bounds, texts)


@SETTINGS
@given(number_bounds(), st.lists(exponent_texts | float_texts, max_size=30))
def test_exponent_forms_are_never_accepted_out_of_range(
    bounds: NumberBounds, texts: list[str]
) -> None:
    check_number_texts(bounds, [*texts, "1e-05", "2.5e-07", "-1e-05", "1e+16", "0e0", "-0.0E-1"])


@settings(max_examples=60, deadline=None)
@given(number_bounds())
def test_number_bounds_accept_no_malformed_text(bounds: NumberBounds) -> None:
    automaton = number_automaton(bounds)
    assert not any(matches(automaton, text) for text in NOT_NUMBERS)


@SETTINGS
@given(
    st.none() | st.integers(-(10**6), 10**6) | st.integers(-(10**20), 10**20),
    st.none() | st.integers(-(10**6), 10**6) | st.integers(-(10**20), 10**20),
    st.lists(st.integers(-(10**7), 10**7) | st.integers(-(10**21), 10**21), max_size=20),
)
def test_integers_are_accepted_exactly_when_in_range(
    minimum: int | None, maximum: int | None, values: list[int]
) -> None:
    if minimum is not None and maximum is not None and minimum > maximum:
        minimum, maximum = maximum, minimum
    automaton = integer_automaton((minimum, maximum))
    bounds: NumberBounds = (
        None if minimum is None else Decimal(minimum),
        None if maximum is None else Decimal(maximum),
        False,
        False,
    )
    edges = [
        bound + step
        for bound in (minimum, maximum)
        if bound is not None
        for step in (-11, -10, -9, -1, 0, 1, 9, 10, 11)
    ]
    for value in [*values, *edges, 0, -1, 1]:
        assert matches(automaton, str(value)) == in_range(Decimal(value), bounds), value
    assert matches(automaton, "-0") == in_range(Decimal(0), bounds)
    for text in [*NOT_NUMBERS, "1.0", "0.0", "1e2", "-0.0", "1E0"]:
        assert not matches(automaton, text), text


@SETTINGS
@given(
    st.none() | small_decimals | st.integers(-100, 100),
    st.none() | small_decimals | st.integers(-100, 100),
    st.none() | st.booleans() | small_decimals | st.floats(-100, 100),
    st.none() | st.booleans() | small_decimals | st.floats(-100, 100),
    st.integers(-1100, 1100),
)
def test_integer_bounds_keep_exactly_the_integers_in_range(
    minimum: Decimal | int | None,
    maximum: Decimal | int | None,
    exclusive_minimum: Decimal | float | bool | None,
    exclusive_maximum: Decimal | float | bool | None,
    value: int,
) -> None:
    lower, upper = integer_bounds_from_schema(
        minimum, maximum, exclusive_minimum, exclusive_maximum
    )
    satisfied = True
    sides = ((minimum, exclusive_minimum, 1), (maximum, exclusive_maximum, -1))
    for bound, exclusive, sign in sides:
        if bound is not None:
            difference = sign * (value - Decimal(str(bound)))
            satisfied &= difference > 0 or (difference == 0 and exclusive is not True)
        if exclusive is not None and not isinstance(exclusive, bool):
            satisfied &= sign * (value - Decimal(str(exclusive))) > 0
    kept = (lower is None or value >= lower) and (upper is None or value <= upper)
    assert kept == satisfied


@pytest.mark.parametrize(
    ("bounds", "accepted", "refused"),
    [
        ((0, 0), ["0", "-0", "0.0", "-0.000", "0e5", "-0.0E-1"], ["0.1", "-0.001", "1e-05"]),
        ((Decimal("2.5"), Decimal("2.5")), ["2.5", "2.50", "2.5e0", "2.5E+00"], ["2.51", "25e-1"]),
        ((Decimal("1.5"), Decimal("1.5")), ["1.5", "1.50", "1.500"], ["1.501", "1.49", "15e-1"]),
        ((0, 1, True), ["0.5", "1", "1.0", "1e-05", "9.9e-1", "1E0"], ["0", "-0", "0.0", "0e1"]),
        (
            (None, Decimal("99.95"), False, True),
            ["99.9499", "-1e300", "-12.5E-3"],
            ["99.95", "99.950", "1e2"],
        ),
        (
            (Decimal("0.5"), None, True),
            ["0.5001", "1e300", "5.1e-1"],
            ["0.5", "0.50", "5e-1", "10e2"],
        ),
        (
            (Decimal("-3.25"), Decimal("-1")),
            ["-3.25", "-3.2500", "-1", "-1.0", "-2.5e0"],
            ["-3.2501", "-0.5", "-0"],
        ),
        ((-2, 2), ["1e-05", "-2.5e-07", "-2", "2.0", "-1.99e+0"], ["2.01", "-2e0001", "2.1E0"]),
        ((0, 100), ["100", "100.000", "1e2", "1E+02", "5e-324"], ["100.01", "1.0001e2", "-1e-9"]),
        ((10**18, None), [str(10**18), "1e18", "1.5e+30"], [str(10**18 - 1), "9.99e17"]),
        ((None, None), ["-12.5e+03", "0", "-0.0", "1E-0", "120e2"], ["1.", "+1"]),
    ],
)
def test_number_edge_cases(bounds: tuple, accepted: list[str], refused: list[str]) -> None:
    low, high, *flags = bounds
    automaton = build_pushdown(Grammar({"root": number_node(low, high, *flags)}))
    assert [text for text in accepted if not matches(automaton, text)] == []
    assert [text for text in refused if matches(automaton, text)] == []


@pytest.mark.parametrize(
    ("bounds", "accepted", "refused"),
    [
        ((0, 0), ["0", "-0"], ["1", "-1", "00"]),
        ((7, 7), ["7"], ["6", "8", "-7", "07", "-0"]),
        ((1, 5), ["1", "5"], ["0", "-0", "6"]),
        ((-5, -1), ["-5", "-1"], ["-0", "0", "-6", "1"]),
        ((None, -3), ["-3", "-1000000000000"], ["-2", "0", "-0"]),
        ((10**18, None), [str(10**18), str(10**40)], [str(10**18 - 1), "0"]),
        ((-(10**18), 10**18), [str(10**18), str(-(10**18)), "-0"], [str(10**18 + 1)]),
    ],
)
def test_integer_edge_cases(bounds: IntegerBounds, accepted: list[str], refused: list[str]) -> None:
    automaton = integer_automaton(bounds)
    assert [text for text in accepted if not matches(automaton, text)] == []
    assert [text for text in refused if matches(automaton, text)] == []


def test_empty_ranges_raise() -> None:
    with pytest.raises(ValueError):
        integer_node(3, 2)
    with pytest.raises(ValueError):
        number_node(Decimal("1.5"), Decimal("1.5"), exclusive_minimum=True)
    with pytest.raises(ValueError):
        number_node(0, 0, exclusive_maximum=True)
    with pytest.raises(ValueError):
        number_node(Decimal("2"), Decimal("1.999"))
    with pytest.raises(ValueError):
        number_node(float("inf"), None)
    with pytest.raises(ValueError):
        integer_bounds_from_schema(None, float("nan"), None, None)


@pytest.mark.parametrize(
    ("arguments", "result"),
    [
        ((1.5, None, None, None), (2, None)),
        ((None, None, None, 10), (None, 9)),
        ((None, None, None, 9.5), (None, 9)),
        ((None, None, 0.1, None), (1, None)),
        ((-1.5, 7.999, None, None), (-1, 7)),
        ((None, None, -1, -1.5), (0, -2)),
        ((3, None, 5, None), (6, None)),
        ((5, 9, True, True), (6, 8)),
        ((Decimal("0.3"), Decimal("1E+20"), None, None), (1, 10**20)),
        ((None, None, None, None), (None, None)),
    ],
)
def test_integer_bounds_examples(arguments: tuple, result: IntegerBounds) -> None:
    assert integer_bounds_from_schema(*arguments) == result


def test_size_grows_with_digits_not_with_values() -> None:
    def node_count(digits: int) -> int:
        return sum(1 for _ in walk(integer_node(-(10**digits) + 7, 3 * 10**digits + 12345)))

    assert node_count(200) < 20 * node_count(10)
    fraction_bound = Decimal("0." + "37" * 50)
    nodes = sum(1 for _ in walk(number_node(-fraction_bound, fraction_bound, True, False)))
    assert nodes < 5000
    automaton = integer_automaton((-(10**30) + 1, 10**30 - 1))
    assert matches(automaton, "9" * 30) and not matches(automaton, "1" + "0" * 30)
    assert automaton.size < 200


large_bounds = st.none() | st.builds(
    lambda sign, power, offset: sign * 10**power + offset,
    st.sampled_from([1, -1]),
    st.integers(0, 22),
    st.integers(-5, 5),
)


@settings(max_examples=40, deadline=None)
@given(
    large_bounds,
    large_bounds,
    st.lists(st.sampled_from(["1", "1.5", "9.99"]), min_size=1, max_size=3),
)
def test_integer_schemas_accept_exponent_spellings_only_in_range(
    low: int | None, high: int | None, mantissas: list[str]
) -> None:
    # Past 1e16 an integer may be written 1e+16 (json.dumps of a float); with one side
    # unbounded those spellings were allowed whatever the other side's bound: under
    # minimum 1e20, 1e+16 was accepted.
    if low is not None and high is not None and low > high:
        low, high = high, low
    bounds = {"minimum": low, "maximum": high}
    given = {key: bound for key, bound in bounds.items() if bound is not None}
    schema = {"type": "integer", **given}
    grammar, _ = schema_to_grammar(schema)
    automaton = build_pushdown(grammar)
    for mantissa in mantissas:
        for exponent in range(16, 24):
            for text in (f"{mantissa}e+{exponent}", f"-{mantissa}e+{exponent}"):
                value = Decimal(text)
                fits = (low is None or value >= low) and (high is None or value <= high)
                assert not matches(automaton, text) or fits, (schema, text)
                open_side = high if value > 0 else low  # spellings only where it is unbounded
                if fits and mantissa == "1" and open_side is None:
                    assert matches(automaton, text), (schema, text)
