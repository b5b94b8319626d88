"""multipleOf read exactly (formline.schema.multiples): the after-check, an enum under a
step and the verbatim narrowing agree with the numbers as written, not with float division."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from formline.schema import compile_schema
from formline.schema.multiples import is_multiple_of

PRICE = {"type": "object", "properties": {"price": {"type": "number", "multipleOf": 0.01}}}


def test_every_two_decimal_price_is_a_multiple_of_a_cent(smollm2_vocab: Any) -> None:
    # jsonschema's float division refused 1,363 of these 9,999 (19.99 / 0.01 = 1998.99...).
    compiled = compile_schema(PRICE, smollm2_vocab, disk_cache=False)
    refused = [cents for cents in range(1, 10_000) if compiled.check({"price": cents / 100})]
    assert refused == []
    assert compiled.check({"price": 19.995}) != []
    assert compiled.check({"price": 20}) == []


def test_an_enum_under_a_step_keeps_what_the_step_takes(smollm2_vocab: Any) -> None:
    schema = {"type": "number", "enum": [19.99, 4.35, 0.07, 0.075], "multipleOf": 0.01}
    compiled = compile_schema(schema, smollm2_vocab, disk_cache=False)
    for text, is_kept in (("19.99", True), ("4.35", True), ("0.07", True), ("0.075", False)):
        matcher = compiled.matcher()
        assert (matcher.accept_string(text) and matcher.can_end()) is is_kept, text


@pytest.mark.parametrize(
    ("value", "step", "expected"),
    [
        (0.3, 0.1, True),
        (0.0075, 0.0001, True),
        (10, 2.5, True),
        (7, 2, False),
        (10**16, 3, False),
        (1e308, 0.123456789, False),  # the official suite's "float division = inf"
        (float("inf"), 1, False),
    ],
)
def test_a_multiple_is_judged_on_the_decimals_as_written(
    value: float, step: float, expected: bool
) -> None:
    assert is_multiple_of(value, step) is expected


@given(st.integers(-(10**6), 10**6), st.integers(1, 10**4), st.integers(0, 6))
def test_a_scaled_integer_is_a_multiple_of_its_scaled_step(
    count: int, units: int, places: int
) -> None:
    step = units / 10**places
    value = float(f"{count * units}e-{places}")
    assert is_multiple_of(value, step)


def test_a_step_that_is_no_positive_number_is_a_value_error() -> None:
    for step in (0, -1, float("nan")):
        with pytest.raises(ValueError, match="multipleOf must be"):
            is_multiple_of(1, step)
