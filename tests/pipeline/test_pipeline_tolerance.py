"""Spelled numbers: the tolerant schema admits them, the coercion reads them back, and a
string that states no single number is left for the after-check to refuse."""

from __future__ import annotations

import jsonschema
import pytest
from pydantic import BaseModel

from formline.pipeline.tolerance import coerce_numbers, read_number, tolerant_schema


class Line(BaseModel):
    sku: str
    quantity: int
    price: float


class Order(BaseModel):
    buyer: str
    lines: list[Line]
    rating: int | None = None


@pytest.mark.parametrize(
    ("text", "integer", "number"),
    [
        ("34", True, 34),
        ("thirty-six", True, 36),
        ("Thirty six", True, 36),
        ("one hundred and five", True, 105),
        ("1,250.5", False, 1250.5),
        ("49,90", False, 49.9),
        ("12,000", True, 12000),  # thousands, not a decimal comma (it read 12)
        ("1,250,000", False, 1250000),
        ("1,5", False, 1.5),
        ("0,500", False, 0.5),  # a leading 0 group: a decimal comma, not 500
        ("1.250,5", False, 1250.5),  # a decimal comma after point-grouped thousands
        ("-7", True, -7),
        ("2.5", True, None),  # not a whole number
        ("thirty or forty", True, None),  # two numbers: no guess
        ("unknown", True, None),
        ("minus five", True, -5),  # the sign in words (it read 5)
        ("negative 3", True, -3),
        ("-five", True, -5),
        ("minus -5", True, None),  # two signs: no guess
        ("second", True, None),  # an ordinal is no amount (it read 2)
        ("5 kg", True, None),  # other words: not all of it a number (it read 5)
        ("1e300", False, 10**300),
        ("1e99999999", True, None),  # past a float's range (building the int took minutes)
    ],
)
def test_a_spelled_number_reads_as_the_one_number_it_states(
    text: str, integer: bool, number: float | None
) -> None:
    assert read_number(text, integer) == number


def test_the_tolerant_schema_admits_both_spellings_and_nothing_else() -> None:
    schema = Order.model_json_schema()
    tolerant = tolerant_schema(schema)
    assert schema == Order.model_json_schema()  # the input is unchanged
    line = {"sku": "A1", "quantity": "three", "price": 2.5}
    jsonschema.validate({"buyer": "Ann", "lines": [line], "rating": "4"}, tolerant)
    jsonschema.validate({"buyer": "Ann", "lines": [{**line, "quantity": 3}]}, tolerant)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"buyer": 5, "lines": []}, tolerant)  # strings stay strings
    with pytest.raises(jsonschema.ValidationError):  # a spelled number is short
        jsonschema.validate({"buyer": "Ann", "lines": [{**line, "quantity": "x" * 80}]}, tolerant)
    enum = {"type": "integer", "enum": [1, 2]}
    assert tolerant_schema(enum) == enum  # an enum is not spelled


def test_coercion_follows_refs_and_reports_the_paths() -> None:
    schema = Order.model_json_schema()
    value = {
        "buyer": "Ann",
        "lines": [
            {"sku": "A1", "quantity": "three", "price": "2.50"},
            {"sku": "B", "quantity": 1, "price": 4},
        ],
        "rating": "four",
    }
    coerced, paths = coerce_numbers(value, schema)
    assert coerced["lines"][0] == {"sku": "A1", "quantity": 3, "price": 2.5}
    assert coerced["rating"] == 4 and coerced["buyer"] == "Ann"
    assert paths == ["lines[0].quantity", "lines[0].price", "rating"]
    Order.model_validate(coerced)


def test_a_string_that_states_no_number_is_left_for_the_after_check() -> None:
    schema = Line.model_json_schema()
    coerced, paths = coerce_numbers({"sku": "A", "quantity": "some", "price": 1}, schema)
    assert coerced["quantity"] == "some" and paths == []
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(coerced, schema)


def test_a_string_the_schema_as_given_takes_is_never_coerced() -> None:
    schema = {
        "type": "object",
        "properties": {
            "code": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
            "count": {"type": "integer"},
        },
    }
    coerced, paths = coerce_numbers({"code": "12", "count": "12"}, schema)
    assert coerced == {"code": "12", "count": 12} and paths == ["count"]
