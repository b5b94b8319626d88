"""Exact numeric bounds as grammar IR: JSON integers and numbers whose value lies in a range.

The nodes match the JSON *text* of a number (bytes). Nothing is enumerated: a range is split
into digit-length blocks and digit-by-digit prefix ranges (the classic "integer range to regex"
construction), so a bound with ``n`` digits costs O(n) nodes and O(n²) NFA states.

Integers (:func:`integer_node`) are ``-?(0|[1-9][0-9]*)``; ``-0`` is accepted only when 0 is
in range. Numbers (:func:`number_node`) follow ``-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?``
and are compared by exact decimal value. A number without an exponent is accepted if and only
if its value is in range, whatever its fraction digits (``1.5``, ``1.50``, ``1.500``).

Exponent forms. For each sign, the magnitudes allowed form an interval ``[low, high]``:

* if ``high`` is unbounded and ``low`` is 0 (the range holds every non-negative number, or
  every non-positive one, maybe except 0), EVERY exponent form of that sign whose value is in
  range is accepted (``12.5e3``, ``0.5E-2``, ``0e0``);
* otherwise only these are accepted, exactly when their value is in range: normalized
  scientific notation, one non-zero digit before the point, ``-?[1-9](\\.[0-9]+)?[eE][+-]?[0-9]+``
  (what Python's ``json.dumps``, JavaScript and Java write, e.g. ``1e-05``, ``2.5e-07``,
  ``1e+16``), and zero mantissas ``-?0(\\.0+)?[eE][+-]?[0-9]+`` when 0 is in range. Every
  other exponent form is REFUSED even when its value is in range: a mantissa with several
  integer digits or with integer part 0 (``10e2``, ``0.5e1``, ``12.5E-3``). An exact grammar
  for those is not regular (it would have to compare the count of mantissa digits with the
  exponent's value), so the byte-level automata cannot express it.
"""

from __future__ import annotations

import math
from decimal import Decimal
from functools import cache

from formline.grammar.ir import EMPTY, ByteSet, Choice, Literal, Node, Repeat, Sequence

DIGIT = ByteSet(((0x30, 0x39),))
NON_ZERO_DIGIT = ByteSet(((0x31, 0x39),))
ZERO = Literal(b"0")
ANY_FRACTION = Repeat(Sequence((Literal(b"."), Repeat(DIGIT, 1))), 0, 1)
EXPONENT_MARK = ByteSet(((0x45, 0x45), (0x65, 0x65)))  # e or E
EXPONENT_SIGN = ByteSet(((0x2B, 0x2B), (0x2D, 0x2D)))  # + or -
ANY_EXPONENT = Sequence((EXPONENT_MARK, Repeat(EXPONENT_SIGN, 0, 1), Repeat(DIGIT, 1)))
ZERO_MANTISSA = Sequence((ZERO, Repeat(Sequence((Literal(b"."), Repeat(ZERO, 1))), 0, 1)))
NORMALIZED_MANTISSA = Sequence((NON_ZERO_DIGIT, ANY_FRACTION))

FractionBound = tuple[str, bool]  # (fraction digits without trailing zeros, exclusive)


def integer_node(minimum: int | None, maximum: int | None) -> Node:
    """JSON integers (no fraction, no exponent) with ``minimum <= value <= maximum``.

    ``None`` leaves a side unbounded. Raises ValueError when ``minimum > maximum``.
    Costs O(digits) nodes (O(digits²) NFA states); values are never enumerated.
    """
    if minimum is None and maximum is None:
        return _any_integer()
    if minimum is not None and maximum is not None and minimum > maximum:
        raise ValueError(f"empty integer range: minimum {minimum} > maximum {maximum}")
    negated_maximum = None if maximum is None else -maximum
    negative = _natural_range(negated_maximum, None if minimum is None else -minimum)
    node = _choice([_natural_range(minimum, maximum), _sequence(Literal(b"-"), negative)])
    assert node is not None  # "-0" has value 0: the mirrored magnitudes need no special case
    return node


def number_node(
    minimum: Decimal | int | float | None,
    maximum: Decimal | int | float | None,
    exclusive_minimum: bool = False,
    exclusive_maximum: bool = False,
) -> Node:
    """JSON numbers whose exact decimal value lies between the bounds (``None``: unbounded).

    Floats are read through ``str`` (``0.1`` is 1/10). Plain decimals in range are all
    accepted; exponent forms as the module docstring says.
    Raises:
        ValueError: an empty range, or a bound that is not finite (or is a boolean).
    Costs O(bound digits) nodes.
    """
    if minimum is None and maximum is None:
        return _any_number()
    low, high = _to_decimal(minimum), _to_decimal(maximum)
    positive = _unsigned_numbers(low, exclusive_minimum, high, exclusive_maximum)
    # "-" and the mirrored magnitudes, flags swapped ("-0" has value 0: no special case).
    negated_low = None if low is None else low.copy_negate()
    negated_high = None if high is None else high.copy_negate()
    negative = _unsigned_numbers(negated_high, exclusive_maximum, negated_low, exclusive_minimum)
    node = _choice([positive, _sequence(Literal(b"-"), negative)])
    if node is None:
        raise ValueError(f"empty number range between {low} and {high}")
    return node


# The unbounded forms, built once: most number and integer fields have no bounds, and a
# number's node was 0.3 ms of Python per field.
@cache
def _any_integer() -> Node:
    natural = _natural_range(None, None)
    node = _choice([natural, _sequence(Literal(b"-"), natural)])
    assert node is not None
    return node


@cache
def _any_number() -> Node:
    positive = _unsigned_numbers(None, False, None, False)
    node = _choice([positive, _sequence(Literal(b"-"), positive)])
    assert node is not None
    return node


def integer_bounds_from_schema(
    minimum: Decimal | int | float | None,
    maximum: Decimal | int | float | None,
    exclusive_minimum: Decimal | int | float | bool | None,
    exclusive_maximum: Decimal | int | float | bool | None,
) -> tuple[int | None, int | None]:
    """Inclusive integer bounds from JSON Schema bounds (numbers of any kind, or ``None``).

    Numeric exclusive bounds follow draft 2020-12 (``exclusiveMaximum: 9.5`` gives 9); a
    boolean one is draft 4's modifier of ``minimum``/``maximum``. When both forms are given,
    the stricter wins. An empty result (lower > upper) is returned as is (:func:`integer_node`
    raises on it). Raises ValueError for a bound that is not finite (or, except the exclusive
    ones, a boolean). Costs O(digits).
    """
    low, high = _to_decimal(minimum), _to_decimal(maximum)
    lowers = [] if low is None else [math.ceil(low)]
    uppers = [] if high is None else [math.floor(high)]
    if low is not None and exclusive_minimum is True:  # draft 4
        lowers = [math.floor(low) + 1]
    if high is not None and exclusive_maximum is True:
        uppers = [math.ceil(high) - 1]
    if not isinstance(exclusive_minimum, bool) and exclusive_minimum is not None:
        lowers.append(math.floor(_finite(exclusive_minimum)) + 1)
    if not isinstance(exclusive_maximum, bool) and exclusive_maximum is not None:
        uppers.append(math.ceil(_finite(exclusive_maximum)) - 1)
    return (max(lowers) if lowers else None, min(uppers) if uppers else None)


def _finite(value: Decimal | int | float) -> Decimal:
    """``value`` as an exact decimal (a float through ``str``, so 0.1 is 1/10)."""
    if isinstance(value, bool):
        raise ValueError(f"a numeric bound cannot be a boolean ({value})")
    number = value if isinstance(value, Decimal) else Decimal(str(value))
    if not number.is_finite():
        raise ValueError(f"a numeric bound must be finite, not {value}")
    return number


def _to_decimal(value: Decimal | int | float | None) -> Decimal | None:
    return None if value is None else _finite(value)


def _sequence(*items: Node | None) -> Node | None:
    """The sequence of ``items``, or ``None`` (matches nothing) when one of them is ``None``."""
    present = [item for item in items if item is not EMPTY]
    if any(item is None for item in present):
        return None
    nodes = [item for item in present if item is not None]
    if not nodes:
        return EMPTY
    return nodes[0] if len(nodes) == 1 else Sequence(tuple(nodes))


def _choice(options: list[Node | None]) -> Node | None:
    """The alternation of the options that match something; ``None`` when none does."""
    present = [option for option in options if option is not None]
    if not present:
        return None
    return present[0] if len(present) == 1 else Choice(tuple(present))


def _digit_range(first: int, last: int) -> Node:
    return ByteSet(((0x30 + first, 0x30 + last),))


def _same_length(low: str, high: str) -> Node:
    """Digit strings of ``len(low)`` between ``low`` and ``high`` (same length, low <= high)."""
    if not low:
        return EMPTY
    if low[0] == high[0]:
        return Sequence((Literal(low[0].encode()), _same_length(low[1:], high[1:])))
    rest = len(low) - 1
    low_full, high_full = low[1:] == "0" * rest, high[1:] == "9" * rest
    first = int(low[0]) + (0 if low_full else 1)
    last = int(high[0]) - (0 if high_full else 1)
    options: list[Node | None] = []
    if not low_full:
        options.append(_sequence(Literal(low[0].encode()), _same_length(low[1:], "9" * rest)))
    if first <= last:
        options.append(_sequence(_digit_range(first, last), Repeat(DIGIT, rest, rest)))
    if not high_full:
        options.append(_sequence(Literal(high[0].encode()), _same_length("0" * rest, high[1:])))
    node = _choice(options)
    assert node is not None
    return node


def _natural_range(low: int | None, high: int | None) -> Node | None:
    """Integers in [low, high] and >= 0, without leading zeros (``None``: there are none)."""
    low = max(low or 0, 0)
    if high is not None and low > high:
        return None
    low_text = str(low)
    if high is not None and len(str(high)) == len(low_text):
        return _same_length(low_text, str(high))
    options: list[Node | None] = [_same_length(low_text, "9" * len(low_text))]
    longest = None if high is None else len(str(high)) - 2  # digits after the first one
    if longest is None or longest >= len(low_text):
        options.append(Sequence((NON_ZERO_DIGIT, Repeat(DIGIT, len(low_text), longest))))
    if high is not None:
        options.append(_same_length("1" + "0" * (len(str(high)) - 1), str(high)))
    return _choice(options)


def _split(value: Decimal) -> tuple[int, str]:
    """Integer part and fraction digits (no trailing zeros) of a non-negative decimal."""
    _, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    coefficient = "".join(map(str, digits))
    if exponent >= 0:
        return int(coefficient) * 10**exponent, ""
    fraction = coefficient[exponent:].rjust(-exponent, "0").rstrip("0")
    return int(coefficient[:exponent] or "0"), fraction


def _zero_fraction_allowed(lower: FractionBound | None, upper: FractionBound | None) -> bool:
    lower_ok = lower is None or (lower[0] == "" and not lower[1])
    return lower_ok and (upper is None or upper[0] != "" or not upper[1])


def _fraction_digits(
    lower: FractionBound | None, upper: FractionBound | None, allow_empty: bool
) -> Node | None:
    """Digit strings ``D`` with ``0.D`` within the bounds (``None``: no bound on that side)."""
    if lower == ("", False):
        lower = None
    minimum_length = 0 if allow_empty else 1
    if upper is not None and upper[0] == "":  # at most 0 (or below 0): only zeros
        return Repeat(ZERO, minimum_length) if lower is None and not upper[1] else None
    if lower is None and upper is None:
        return Repeat(DIGIT, minimum_length)
    if upper is None and lower == ("", True):  # greater than zero: some non-zero digit
        return Sequence((Repeat(ZERO), NON_ZERO_DIGIT, Repeat(DIGIT)))
    options: list[Node | None] = [EMPTY] if allow_empty and lower is None else []
    low_digit, lower_rest = 0, None  # a bound's first digit, and the bound on the rest
    if lower is not None:
        low_digit, lower_rest = int(lower[0][:1] or "0"), (lower[0][1:], lower[1])
    high_digit, upper_rest = 9, None
    if upper is not None:
        high_digit, upper_rest = int(upper[0][0]), (upper[0][1:], upper[1])
    if low_digit == high_digit:
        tail = _fraction_digits(lower_rest, upper_rest, True)
        options.append(_sequence(Literal(str(low_digit).encode()), tail))
    elif low_digit < high_digit:
        low_tail = _fraction_digits(lower_rest, None, True)
        options.append(_sequence(Literal(str(low_digit).encode()), low_tail))
        if low_digit + 1 <= high_digit - 1:
            options.append(Sequence((_digit_range(low_digit + 1, high_digit - 1), Repeat(DIGIT))))
        high_tail = _fraction_digits(None, upper_rest, True)
        options.append(_sequence(Literal(str(high_digit).encode()), high_tail))
    return _choice(options)


def _with_fraction(
    integer: int, lower: FractionBound | None, upper: FractionBound | None
) -> Node | None:
    """The integer part ``integer`` followed by a fraction (maybe none) within the bounds."""
    options: list[Node | None] = [EMPTY] if _zero_fraction_allowed(lower, upper) else []
    options.append(_sequence(Literal(b"."), _fraction_digits(lower, upper, False)))
    return _sequence(Literal(str(integer).encode()), _choice(options))


def _plain_magnitude(
    low: Decimal, low_exclusive: bool, high: Decimal | None, high_exclusive: bool
) -> Node | None:
    """Unsigned numbers without exponent with value in the range (low >= 0; None: empty)."""
    if high is not None and (low > high or (low == high and (low_exclusive or high_exclusive))):
        return None
    low_integer, low_fraction = _split(low)
    lower = (low_fraction, low_exclusive)
    if high is None:
        above = _sequence(_natural_range(low_integer + 1, None), ANY_FRACTION)
        return _choice([_with_fraction(low_integer, lower, None), above])
    high_integer, high_fraction = _split(high)
    upper = (high_fraction, high_exclusive)
    if low_integer == high_integer:
        return _with_fraction(low_integer, lower, upper)
    first = _with_fraction(low_integer, lower, None)
    between = _sequence(_natural_range(low_integer + 1, high_integer - 1), ANY_FRACTION)
    return _choice([first, between, _with_fraction(high_integer, None, upper)])


def _unsigned_numbers(
    low: Decimal | None, low_exclusive: bool, high: Decimal | None, high_exclusive: bool
) -> Node | None:
    """Numbers without sign, plain and exponent forms, with value in the range and >= 0."""
    if high is not None and high < 0:
        return None
    if low is None or low < 0:
        low, low_exclusive = Decimal(0), False
    low, high = low.copy_abs(), None if high is None else high.copy_abs()  # no "-0"
    plain = _plain_magnitude(low, low_exclusive, high, high_exclusive)
    if plain is None:
        return None
    if high is None and low == 0:  # every exponent form with a mantissa in range
        return Sequence((plain, Repeat(ANY_EXPONENT, 0, 1)))
    options: list[Node | None] = [plain]
    if low == 0 and not low_exclusive:
        options.append(Sequence((ZERO_MANTISSA, ANY_EXPONENT)))
    if high is not None and high == 0:
        return _choice(options)
    low_decade = low.adjusted() if low > 0 else None
    high_decade = high.adjusted() if high is not None else None
    if low_decade is not None and high is not None and low_decade == high_decade:
        options.append(_decade(low_decade, (low, low_exclusive), (high, high_exclusive)))
        return _choice(options)
    if low_decade is not None:
        options.append(_decade(low_decade, (low, low_exclusive), None))
    first = None if low_decade is None else low_decade + 1
    last = None if high_decade is None else high_decade - 1
    if first is None or last is None or first <= last:
        options.append(_sequence(NORMALIZED_MANTISSA, _exponent(first, last)))
    if high is not None and high_decade is not None:
        options.append(_decade(high_decade, None, (high, high_exclusive)))
    return _choice(options)


def _decade(
    exponent: int, lower: tuple[Decimal, bool] | None, upper: tuple[Decimal, bool] | None
) -> Node | None:
    """Normalized ``m e exponent`` (1 <= m < 10) with value within the bounds, exactly."""
    low, low_exclusive = (Decimal(1), False) if lower is None else lower
    high, high_exclusive = (Decimal(10), True) if upper is None else upper
    if lower is not None:
        low = _shift(low, -exponent)
    if upper is not None:
        high = _shift(high, -exponent)
    mantissa = _plain_magnitude(low, low_exclusive, high, high_exclusive)
    return _sequence(mantissa, _exponent(exponent, exponent))


def _shift(value: Decimal, places: int) -> Decimal:
    """``value * 10**places``, exactly (no context rounding)."""
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    return Decimal((sign, digits, exponent + places))


def _exponent(low: int | None, high: int | None) -> Node:
    """``[eE][+-]?[0-9]+`` spelling an exponent in [low, high] (leading zeros allowed)."""
    positive = _natural_range(low, high)
    negative = _natural_range(None if high is None else -high, None if low is None else -low)
    signed = _choice(
        [
            _sequence(Repeat(Literal(b"+"), 0, 1), Repeat(ZERO), positive),
            _sequence(Literal(b"-"), Repeat(ZERO), negative),
        ]
    )
    assert signed is not None
    return Sequence((EXPONENT_MARK, signed))
