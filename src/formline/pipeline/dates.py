"""The calendar dates a text states, written as ISO 8601 (``YYYY-MM-DD``).

A schema asks for ``"format": "date"``; the text says "the fifteenth of April 2025" or
"15/08/2024 (DD/MM/YYYY)". SmolLM2, forced onto the ISO shape digit by digit, reorders the
digits: on the 12 extraction-dev contracts it wrote ``1508-08-24`` for "15/08/2024",
``1500-01-01`` for "the fifteenth of April 2025" and got 2 of 12 start dates right under
``verbatim``. :func:`source_dates` gives :mod:`.verbatim` the dates to choose from instead.

Read (English month names, full or three-letter; days as digits, "3rd" or ordinal words):

- ISO ``2025-01-15`` (also ``2025/01/15``, and inside a timestamp); "March 3, 2025";
  "3 March 2025", "3rd of March, 2025"; "the third of March 2025".
- Numeric ``15/08/2024``, ``15.08.2024``, ``15-08-2024``: day first or month first. A hint
  within 40 characters after it, else before it, and not past another number
  ("DD/MM/YYYY", "day/month/year", "MM/DD/YYYY", "month/day/year") picks one reading;
  without one, every valid reading is kept, day first before month first.

A month without a day ("June 2024") is not a date. Only the Gregorian calendar's valid days
are kept (no 31 April).
"""

from __future__ import annotations

import datetime
import re

MONTH_NAMES = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
]
MONTHS = {name: number for number, name in enumerate(MONTH_NAMES, start=1)}
MONTHS.update({name[:3]: number for name, number in list(MONTHS.items())})
MONTHS["sept"] = 9
DAY_ORDINALS = [
    "first",
    "second",
    "third",
    "fourth",
    "fifth",
    "sixth",
    "seventh",
    "eighth",
    "ninth",
    "tenth",
    "eleventh",
    "twelfth",
    "thirteenth",
    "fourteenth",
    "fifteenth",
    "sixteenth",
    "seventeenth",
    "eighteenth",
    "nineteenth",
    "twentieth",
]
ORDINAL_DAYS = {word: day for day, word in enumerate(DAY_ORDINALS, start=1)}
ORDINAL_DAYS.update({f"twenty-{word}": 20 + day for word, day in list(ORDINAL_DAYS.items())[:9]})
ORDINAL_DAYS.update({"thirtieth": 30, "thirty-first": 31})

_MONTH = r"(?P<month>" + "|".join(sorted(MONTHS, key=len, reverse=True)) + r")\.?"
_DAY = (
    r"(?P<day>[0-9]{1,2}(?:st|nd|rd|th)?|"
    + "|".join(sorted((word.replace("-", r"[- ]") for word in ORDINAL_DAYS), key=len, reverse=True))
    + ")"
)
_YEAR = r"(?P<year>[0-9]{4})"
PATTERNS = (
    # ISO, also inside a timestamp ("2025-01-15T10:00Z") and with / or . ("2025/01/15")
    re.compile(
        r"(?<![0-9])(?P<year>[0-9]{4})([-/.])(?P<month>[0-9]{1,2})\2(?P<day>[0-9]{1,2})(?![0-9])"
    ),
    re.compile(rf"\b{_MONTH}\s+{_DAY}(?:,\s*|\s+){_YEAR}\b", re.IGNORECASE),
    re.compile(rf"\b(?:the\s+)?{_DAY}\s+(?:day\s+)?(?:of\s+)?{_MONTH}(?:,\s*|\s+){_YEAR}\b", re.I),
)
NUMERIC = re.compile(r"\b(?P<first>[0-9]{1,2})([/.-])(?P<second>[0-9]{1,2})\2(?P<year>[0-9]{4})\b")
# The year's place too: "YYYY-MM-DD" (an answer format) is not a hint for "05/06/2025".
DAY_FIRST_HINT = re.compile(r"DD[/.-]MM[/.-]Y|day[/.-]month", re.IGNORECASE)
MONTH_FIRST_HINT = re.compile(r"MM[/.-]DD[/.-]Y|month[/.-]day", re.IGNORECASE)
HINT_REACH = 40  # characters around a numeric date where "(DD/MM/YYYY)" may stand


def source_dates(source: str) -> list[str]:
    """Every date ``source`` states, as ``YYYY-MM-DD``, once each, in text order (an
    ambiguous numeric date gives each valid reading, day first first). Costs four regular
    expression scans of ``source`` (linear in its length)."""
    found: list[tuple[int, int, str]] = []
    for pattern in PATTERNS:
        for match in pattern.finditer(source):
            day = _day_number(match.group("day"))
            date = _iso(match.group("year"), _month_number(match.group("month")), day)
            if date:
                found.append((match.start(), 0, date))
    for match in NUMERIC.finditer(source):
        first, second = int(match.group("first")), int(match.group("second"))
        for rank, (day, month) in enumerate(_numeric_readings(source, match, first, second)):
            date = _iso(match.group("year"), month, day)
            if date:
                found.append((match.start(), rank, date))
    return list(dict.fromkeys(date for _, _, date in sorted(found)))


def _numeric_readings(
    source: str, match: re.Match[str], first: int, second: int
) -> list[tuple[int, int]]:
    """(day, month) readings of a numeric date, narrowed by a hint that follows it."""
    after = re.split(r"[0-9]", source[match.end() : match.end() + HINT_REACH])[0]
    before = re.split(r"[0-9]", source[max(0, match.start() - HINT_REACH) : match.start()])[-1]
    for window in (after, before):  # up to the next (or previous) number: another date's
        if DAY_FIRST_HINT.search(window):
            return [(first, second)]
        if MONTH_FIRST_HINT.search(window):
            return [(second, first)]
    return [(first, second), (second, first)]


def _day_number(text: str) -> int:
    text = text.lower()
    if text[:1].isdigit():
        return int(re.sub(r"[^0-9]", "", text))
    return ORDINAL_DAYS[re.sub(r"\s+", "-", text)]


def _month_number(text: str) -> int:
    return int(text) if text.isdigit() else MONTHS[text.lower().rstrip(".")]


def _iso(year: str, month: int, day: int) -> str | None:
    try:
        return datetime.date(int(year), month, day).isoformat()
    except ValueError:
        return None
