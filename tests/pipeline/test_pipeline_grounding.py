"""Grounding checks: extracted values against the source text (formline.pipeline.grounding)."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from formline.evaluation.dataset import extraction_dev_directory
from formline.pipeline.grounding import (
    GroundingError,
    copied_confidence,
    extract_numbers,
    field_confidence,
    ground,
    grounded_share,
    number_is_grounded,
    string_is_grounded,
    value_shape_share,
)

EXTRACTION = extraction_dev_directory()

SMALL = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
SMALL += " fifteen sixteen seventeen eighteen nineteen"
TENS = "twenty thirty forty fifty sixty seventy eighty ninety"
SMALL_WORDS, TEN_WORDS = SMALL.split(" "), TENS.split(" ")


def spell_below_thousand(number: int, british: bool, hyphen: bool) -> str:
    """A reference English spelling of 1..999 ("one hundred and forty-two")."""
    hundreds, rest = divmod(number, 100)
    words = [f"{SMALL_WORDS[hundreds]} hundred"] if hundreds else []
    if rest and hundreds and british:
        words.append("and")
    if 0 < rest < 20:
        words.append(SMALL_WORDS[rest])
    elif rest:
        tens, units = divmod(rest, 10)
        joiner = "-" if hyphen else " "
        words.append(TEN_WORDS[tens - 2] + (joiner + SMALL_WORDS[units] if units else ""))
    return " ".join(words)


def spell(number: int, british: bool = False, hyphen: bool = True) -> str:
    """A reference English spelling of 0..999,999,999."""
    if number == 0:
        return "zero"
    words: list[str] = []
    for scale, name in ((10**6, "million"), (10**3, "thousand"), (1, "")):
        group, number = divmod(number, scale)
        if group:
            if not name and words and group < 100 and british:
                words.append("and")
            words.append(f"{spell_below_thousand(group, british, hyphen)} {name}".strip())
    return " ".join(words)


@given(st.integers(0, 999_999), st.booleans(), st.booleans())
def test_number_words_round_trip_below_a_million(number: int, british: bool, hyphen: bool) -> None:
    spelled = spell(number, british, hyphen)
    assert extract_numbers(spelled) == [Decimal(number)], spelled
    assert number_is_grounded(number, f"She paid {spelled.capitalize()} dollars.")


IRREGULAR = {"one": "first", "two": "second", "three": "third", "five": "fifth", "eight": "eighth"}
IRREGULAR |= {"nine": "ninth", "twelve": "twelfth"}


def ordinal(spelled: str) -> str:
    """The ordinal of a reference spelling ("forty-two" becomes "forty-second")."""
    match = re.fullmatch(r"(.*?)([a-z]+)", spelled)
    assert match is not None
    head, last = match.groups()
    if last in IRREGULAR:
        return head + IRREGULAR[last]
    return head + (last[:-1] + "ieth" if last.endswith("y") else last + "th")


@given(st.integers(1, 999_999), st.booleans())
def test_ordinal_words_round_trip(number: int, hyphen: bool) -> None:
    spelled = ordinal(spell(number, hyphen=hyphen))
    assert extract_numbers(f"the {spelled} time") == [Decimal(number)], spelled


@given(st.integers(0, 999_999_999), st.booleans())
def test_number_words_round_trip_below_a_billion(number: int, british: bool) -> None:
    assert extract_numbers(spell(number, british)) == [Decimal(number)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("At thirty-six, Priya", [36]),
        ("seventy-one-year-old Ingrid", [71]),
        ("Nineteen-year-old Aroha", [19]),
        ("one hundred and eighty (180) days", [180, 180]),
        ("two thousand and five", [2005]),
        ("a hundred and twelve", [112]),
        ("twelve hundred", [1200]),
        ("a dozen friends and two dozen eggs", [12, 24]),
        ("the first of June", [1]),
        ("the twenty-ninth birthday, the fifteenth of April", [29, 15]),
        ("one hundredth", [100]),
        ("nineteen eighty-four", [19, 84]),
        ("three and four", [3, 4]),
        ("one two three", [1, 2, 3]),
        ("an ordinary sentence, and a short one", [1]),
    ],
)
def test_number_words_in_text(text: str, expected: list[int]) -> None:
    assert extract_numbers(text) == [Decimal(value) for value in expected]


@pytest.mark.parametrize(
    ("value", "source"),
    [
        (25000, "3 nasi gudeg @ Rp25.000"),
        (25000.0, "3 nasi gudeg @ Rp25.000"),
        (49.9, "2 × LED panel at 49,90 € each"),
        (Decimal("289.30"), "Total: 289,30 €."),
        (1500, "1,500 units"),
        (1.5, "1,500 kg at 49,90 € per kg"),  # the text writes decimal commas
        (0.5, "0,500 kg"),  # a leading 0 group is no thousands
        (1500, "1 500 units"),
        (1500, "1\u00a0500 units"),
        (1234.56, "1.234,56 €"),
        (1234567.5, "1,234,567.50 USD"),
        (560000, "Total: IDR 560,000."),
        (0.12, "500 business cards at $0.12 each"),
        (29, "marked her 29th birthday"),
        (40, "turned 40 in March"),
        (14, "14.08.2024"),
        (1_500_000, "a budget of 1.5 million euros"),
        (36, "36"),
        (-36, "36"),
    ],
)
def test_digits_with_separators_are_grounded(value: int | float | Decimal, source: str) -> None:
    assert number_is_grounded(value, source)


@pytest.mark.parametrize(
    ("value", "source"),
    [
        (36, "360 people"),
        (36, "born in 1936"),
        (36, "3.6 metres"),
        (49, "49,90 €"),
        (90, "49,90 €"),
        (500, "1,500 units"),
        (12, "Acme Corp employs 12,000 people."),  # read as 12.000 it grounded 12
        (1.5, "1,500 units"),
        (42, "turned 40 in March"),
        (float("nan"), "nan"),
        (float("inf"), "infinity"),
    ],
)
def test_numbers_respect_token_boundaries(value: float, source: str) -> None:
    assert not number_is_grounded(value, source)


NOT_A_NUMBER: Any = "36"


def test_number_is_grounded_rejects_non_numbers() -> None:
    with pytest.raises(TypeError):
        number_is_grounded(True, "1")
    with pytest.raises(TypeError):
        number_is_grounded(NOT_A_NUMBER, "36")


@pytest.mark.parametrize(
    ("value", "source", "grounded"),
    [
        ("Kraków", "Kraków software tester Tomasz Wójcik", True),
        ("KRAKÓW", "Kraków software tester", True),
        ("Kraków", "Krako\u0301w software tester", True),  # decomposed accent (NFC)
        ("Krakow", "Kraków software tester", False),  # accents must match
        ("Kraków", "Krakow software tester", False),
        ("tomasz  wójcik", "tester Tomasz\nWójcik turned 40", True),
        ("  Porto Alegre ", "a fruit seller from Porto   Alegre,", True),
        ("Straße", "Hauptstrasse 5", False),
        ("STRASSE", "an der Straße", True),  # casefold: ß is ss
        ("the city's", "the city’s symphony", True),  # typographic apostrophe
        ("Ann", "Anna Kowalska", False),  # whole words only
        ("Rivera & Sons", "Rivera & Sons Construction SpA", True),
        ("Ltd.", "Helix Ltd. and", True),
        ("", "anything", False),
        ("   ", "anything", False),
        ("Lisbon", "Kraków", False),
    ],
)
def test_string_is_grounded(value: str, source: str, grounded: bool) -> None:
    assert string_is_grounded(value, source) is grounded


@given(st.text(min_size=1), st.text(), st.text())
def test_a_string_is_grounded_in_any_text_around_it(value: str, before: str, after: str) -> None:
    if value.strip() and value[0].isalnum() and value[-1].isalnum():
        assert string_is_grounded(value, f"{before} {value} {after}")


PERSON_SOURCE = "Kraków software tester Tomasz Wójcik turned 40 in March."


def test_ground_reports_a_missing_value_naming_the_field() -> None:
    person = {"name": "Tomasz Wójcik", "age": 42, "city": "Krakow", "employed": True}
    errors = ground(person, PERSON_SOURCE)
    assert [error.path for error in errors] == ["age", "city"]
    assert errors[0] == GroundingError(
        "age", 42, "age = 42 does not occur in the source (as digits or words)"
    )
    assert str(errors[1]).startswith("city = 'Krakow' does not occur in the source")


def test_ground_accepts_a_grounded_value_and_skips_booleans_and_nulls() -> None:
    value = {"name": "Tomasz Wójcik", "age": 40, "city": "KRAKÓW", "ok": False, "x": None}
    assert ground(value, PERSON_SOURCE) == []


INVOICE_SOURCE = (
    "Invoice no. 2024-118 from Elektro Schulz GmbH: 2 × LED panel at 49,90 € each, "
    "1 × motion sensor at 24,50 €, labour 3 h at 55,00 €/h. Total: 289,30 €."
)
INVOICE = {
    "vendor": "Elektro Schulz GmbH",
    "currency": "EUR",
    "items": [
        {"description": "LED panel", "quantity": 2, "unit_price": 49.9},
        {"description": "motion sensor", "quantity": 1, "unit_price": 24.5},
        {"description": "labour", "quantity": 3, "unit_price": 55.5},
    ],
    "total": 289.3,
}


def test_ground_walks_nested_paths() -> None:
    errors = ground(INVOICE, INVOICE_SOURCE)
    assert [(error.path, error.value) for error in errors] == [
        ("currency", "EUR"),
        ("items[2].unit_price", 55.5),
    ]
    assert errors[1].message.startswith("items[2].unit_price = 55.5 does not occur")


@pytest.mark.parametrize(
    ("fields", "paths"),
    [
        (None, ["currency", "items[2].unit_price"]),
        (["vendor", "total"], []),
        (["items"], ["items[2].unit_price"]),
        (["items[].description", "items[].quantity"], []),
        (["items[].unit_price"], ["items[2].unit_price"]),
        (["items[2].unit_price"], ["items[2].unit_price"]),
        ({"items[1]", "currency"}, ["currency"]),
        ("currency", ["currency"]),
        (["item"], []),
    ],
)
def test_ground_selects_fields(fields: list[str] | None, paths: list[str]) -> None:
    assert [error.path for error in ground(INVOICE, INVOICE_SOURCE, fields)] == paths


def test_ground_checks_a_bare_leaf_and_rejects_non_json_values() -> None:
    assert [error.path for error in ground(7, "six")] == [""]
    assert ground("six", "Six apples") == []
    with pytest.raises(TypeError):
        ground({"when": object()}, "text")


def test_the_dev_golds_are_grounded_except_inferred_values() -> None:
    fields = {
        "person": ["name", "age", "city"],
        "contract": ["parties", "notice_days"],
        "invoice": ["vendor", "items[].quantity", "items[].unit_price", "total"],
    }
    ungrounded = set()
    for line in (EXTRACTION / "tasks.jsonl").read_text(encoding="utf-8").splitlines():
        task = json.loads(line)
        if task["type"] in fields:
            for error in ground(task["gold"], task["text"], fields[task["type"]]):
                ungrounded.add((task["id"], error.path))
    # "turns 30 next month" is 29, and invoice-11 states no total: both are inferred.
    assert ungrounded == {("person-12", "age"), ("invoice-11", "total")}


def test_grounded_share_counts_the_strings_and_numbers_found() -> None:
    source = "Ada Lovelace was thirty-six; she lived in London."
    assert grounded_share("Ada Lovelace", source) == 1.0
    assert grounded_share(36, source) == 1.0  # read from the words
    assert grounded_share({"name": "Ada", "age": 24}, source) == 0.5
    assert grounded_share(["Paris", "London", 36, True], source) == pytest.approx(2 / 3)
    assert grounded_share(True, source) is None  # nothing to look for
    assert grounded_share([], source) is None


def test_field_confidence_weighs_the_share_and_the_model() -> None:
    source = "Mateus Carvalho, 34, Porto Alegre."
    assert field_confidence("Porto Alegre", source, 0.4) == pytest.approx(0.7 + 0.12)
    assert field_confidence("Lisbon", source, 0.4) == pytest.approx(0.12)
    assert field_confidence(None, source, 0.4) == pytest.approx(0.35 + 0.12)  # nothing to find
    # A value copied from the text ranks above an invented one the model was as sure of.
    assert field_confidence(34, source, 0.3) > field_confidence(23, source, 0.3)


def test_a_copied_value_that_runs_on_is_not_trusted() -> None:
    assert value_shape_share("Rivera & Sons Construction SpA") == 1.0
    assert value_shape_share("SARL. The engagement begins on July 7") == 0.0
    assert value_shape_share("2025; it may be terminated") == 0.0  # a clause break inside
    assert value_shape_share(["Kestrel Foods plc", "the lease between the two of them"]) == 0.5
    assert value_shape_share(36) is None and value_shape_share(None) is None
    assert copied_confidence("Porto Alegre", 0.9) == 0.9  # the model's probability
    assert copied_confidence("Atelier Moreau, Lyon", 0.9) == 0.0  # a run of text
    assert copied_confidence(3, 0.0) == 0.0  # a number the budget wrote


def test_number_words_join_across_spaces_and_one_hyphen_only() -> None:
    # A gap of 40,000 newlines before a "." took 14.6 s (the gap regex backtracked).
    source = "word" + "\n" * 40_000 + ". forty-two, sixty\n-\nsix, seventy -- one, fifty . five"
    assert extract_numbers(source) == [42, 66, 70, 1, 50, 5]
