"""The dates a text states, as ISO 8601 (formline.pipeline.dates): written forms, numeric
readings and their hints, impossible days refused."""

from __future__ import annotations

import pytest

from formline.pipeline.dates import source_dates


@pytest.mark.parametrize(
    ("text", "dates"),
    [
        ("commences on March 3, 2025.", ["2025-03-03"]),
        ("starts on 12 October 2024", ["2024-10-12"]),
        ("Effective the first of June 2024, Bright Harbor", ["2024-06-01"]),
        ("commences on the fifteenth of April 2025.", ["2025-04-15"]),
        ("on the twenty-first of June, 2024", ["2024-06-21"]),
        ("effective 2025-01-15. Termination", ["2025-01-15"]),
        ("from Sept. 9, 2023 and the 3rd of Jan 2024", ["2023-09-09", "2024-01-03"]),
        ("begins on 15/08/2024 (DD/MM/YYYY).", ["2024-08-15"]),
        ("takes effect on 11/02/2025 (MM/DD/YYYY) between", ["2025-11-02"]),
        ("starting 05/06/2025 (day/month/year)", ["2025-06-05"]),
        ("starting 05.06.2025", ["2025-06-05", "2025-05-06"]),  # no hint: both, day first
        ("starting 25/06/2025", ["2025-06-25"]),  # month 25 does not exist
        ("logged 2025-01-15T10:00:00Z", ["2025-01-15"]),
        ("filed 2025/01/15", ["2025-01-15"]),
        ("april 1,2025", ["2025-04-01"]),
        ("Date (DD/MM/YYYY): 05/06/2025", ["2025-06-05"]),  # a hint before it
        ("05/06/2025 (answer as YYYY-MM-DD)", ["2025-06-05", "2025-05-06"]),  # not a hint
        ("12/31/2024 and 1/2/2025 (DD/MM/YYYY)", ["2024-12-31", "2025-02-01"]),  # not its hint
    ],
)
def test_dates_are_read_in_their_written_forms(text: str, dates: list[str]) -> None:
    assert source_dates(text) == dates


def test_dates_come_in_text_order_once_each() -> None:
    text = "Signed on 20 November 2024, effective January 1, 2025 (signed 20 Nov 2024)."
    assert source_dates(text) == ["2024-11-20", "2025-01-01"]


@pytest.mark.parametrize(
    "text", ["in June 2024", "on 31 April 2025", "2024-02-30", "within 30 days", "14.08"]
)
def test_what_is_not_a_calendar_day_is_not_read(text: str) -> None:
    assert source_dates(text) == []
