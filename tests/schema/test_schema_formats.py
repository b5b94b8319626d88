"""Format grammars against jsonschema's draft 2020-12 format checker and the official suite.

The reference is ``Draft202012Validator.FORMAT_CHECKER`` as installed here. A format whose
checker needs a missing package (time and date-time: rfc3339-validator, hostname: fqdn, uri:
rfc3987 or rfc3986-validator, duration: isoduration) is judged by the suite's own verdicts
instead, and its differential tests are skipped. The rules:
every string both the reference and the suite call valid is accepted; every accepted string
the reference refuses is a documented gap (:data:`FORMAT_GAPS`). Exact formats are also
compared with the checker on structured random strings, both ways.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from conformance_suite import SUITE as OFFICIAL_SUITE
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from test_schema_patterns import body_matcher

from formline.schema.formats import FORMAT_GAPS, FORMAT_NARROWER, FORMAT_PATTERNS, format_node

SUITE = OFFICIAL_SUITE / "draft2020-12" / "optional" / "format"
CHECKER = Draft202012Validator.FORMAT_CHECKER
FORMATS = sorted(FORMAT_PATTERNS)
MISSING_CHECKERS = {name for name in FORMATS if name not in CHECKER.checkers}
SETTINGS = settings(max_examples=150, deadline=None)
# fmt: off
REAL_WORLD = {
    "date": ["2024-02-29", "1999-12-31", "2000-02-29", "0001-01-01", "2023-06-30"],
    "time": ["00:00:00Z", "23:59:59.999+05:30", "12:30:00-08:00", "08:15:00.5z"],
    "date-time": ["2024-06-01T12:34:56Z", "2024-06-01T12:34:56.789+02:00",
                  "1970-01-01T00:00:00.000000Z", "2021-12-31t23:59:59-00:00"],
    "duration": ["P1Y2M10DT2H30M", "PT15M", "P3W", "PT0S", "P1Y1D", "PT1H30S", "P30D"],
    "email": ["first.last+tag@sub.example.co.uk", "user_name@example.io", "x@localhost",
              "o'brien@example.ie", "admin@[192.168.0.1]", "a@[IPv6:2001:db8::1]"],
    "hostname": ["api.example.com", "localhost", "example.com.", "xn--bcher-kva.example",
                 "a.b-c.d1", "1.2.3.4"],
    "ipv4": ["10.0.0.1", "255.255.255.255", "0.0.0.0", "192.168.100.254"],
    "ipv6": ["2001:db8::1", "fe80::1ff:fe23:4567:890a", "::ffff:192.0.2.128", "::",
             "2001:0db8:85a3:0000:0000:8a2e:0370:7334", "1::", "::1:2:3:4:5:6:7"],
    "uuid": ["123e4567-e89b-12d3-a456-426614174000", "FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF"],
    "uri": ["https://example.com/path?q=1&r=%20x#frag", "mailto:a@b.c", "urn:isbn:0451450523",
            "file:///etc/hosts", "https://user:pw@[2001:db8::1]:8080/a/b", "http://[v1.x]/",
            "http://example.com/%E2%82%AC", "data:text/plain,hi", "s3://bucket/key", "x:"],
}
REAL_WORLD_INVALID = {
    "date": ["2023-02-29", "1900-02-29", "2024-04-31", "0000-01-01", "2024-1-01", "24-01-01"],
    "time": ["24:00:00Z", "12:00:00", "12:60:00Z", "12:00:00+5:00", "23:59:60Z"],
    "date-time": ["2024-06-01 12:34:56Z", "2024-06-01T12:34:56", "2023-02-29T00:00:00Z"],
    "duration": ["P", "PT", "P1H", "1D", "P1.5D", "P1W2D", "P1D1Y"],
    "email": ["plain", "@example.com", "a@", "a@@b.c", "a b@c.d", "a@-x.com", "a@b..c"],
    "hostname": ["", ".", "-a.com", "a-.com", "a..b", "a_b.com", "a" * 64, "é.com"],
    "ipv4": ["01.2.3.4", "256.1.1.1", "1.2.3", "1.2.3.4.5", " 1.2.3.4", "1.2.3.4\n"],
    "ipv6": ["1:2:3:4:5:6:7:8:9", "1::2::3", "12345::", "::1%eth0", "[::1]", "1:2:3:4:5:6:7"],
    "uuid": ["123e4567e89b12d3a456426614174000", "{123e4567-e89b-12d3-a456-426614174000}",
             "123e4567-e89b-12d3-a456-42661417400g"],
    "uri": ["", "example.com", "/relative", "http://exa mple.com", "1http://x", "http://%zz",
            "http://[::1", "https://example.com/\u00e9"],
}
# fmt: on


def format_matcher(name: str) -> Callable[[str], bool]:
    """Whether the format node accepts the whole canonical JSON body of a string."""
    node = format_node(name)
    assert node is not None
    return body_matcher(node)


def reference(name: str, text: str, suite_valid: bool | None = None) -> bool:
    """The checker's verdict, or the suite's where the checker is not installed."""
    if name in MISSING_CHECKERS:
        assert suite_valid is not None, f"no checker for {name}: only suite cases can be judged"
        return suite_valid
    return CHECKER.conforms(text, name)


def suite_cases(name: str) -> list[tuple[str, bool]]:
    cases = []
    for group in json.loads((SUITE / f"{name}.json").read_text()):
        cases += [(t["data"], t["valid"]) for t in group["tests"] if isinstance(t["data"], str)]
    return cases


def test_checkers_without_optional_packages_are_present() -> None:
    assert {"date", "email", "ipv4", "ipv6", "uuid"} <= set(CHECKER.checkers)


def test_unknown_format_gives_none() -> None:
    assert format_node("color") is None
    assert format_node("") is None
    assert set(FORMAT_GAPS) <= set(FORMAT_PATTERNS)
    assert set(FORMAT_NARROWER) <= set(FORMAT_PATTERNS)


@pytest.mark.parametrize("name", FORMATS)
def test_official_suite_cases(name: str) -> None:
    matches = format_matcher(name)
    leaks: list[str] = []
    for text, suite_valid in suite_cases(name):
        expected = reference(name, text, suite_valid)
        if expected and suite_valid:
            assert matches(text), (name, text)
        if matches(text) and not expected:
            leaks.append(text)
    # Accepted although the reference refuses: only a documented gap may do that, and only
    # the gap it documents (a hostname's total length).
    if name == "hostname":
        assert all(len(text.removesuffix(".")) > 253 for text in leaks), leaks
    else:
        assert not leaks and name not in FORMAT_GAPS, (name, leaks)


@pytest.mark.parametrize("name", FORMATS)
def test_real_world_values(name: str) -> None:
    matches = format_matcher(name)
    for text in REAL_WORLD[name]:
        assert matches(text), (name, text)
        if name not in MISSING_CHECKERS:
            assert CHECKER.conforms(text, name), (name, text)
    for text in REAL_WORLD_INVALID[name]:
        assert not matches(text), (name, text)


def assert_same_as_checker(name: str, text: str) -> None:
    assert format_matcher(name)(text) == CHECKER.conforms(text, name), (name, text)


two_digits = st.integers(0, 99).map("{:02d}".format)


@SETTINGS
@given(st.integers(0, 9999), st.integers(0, 13), st.integers(0, 32), st.sampled_from("-/"))
def test_date_is_exact(year: int, month: int, day: int, separator: str) -> None:
    assert_same_as_checker("date", f"{year:04d}-{month:02d}{separator}{day:02d}")


def test_date_leap_years_are_exact() -> None:
    for year in [*range(1, 500), *range(1500, 2500, 4), 9996, 9999]:
        assert_same_as_checker("date", f"{year:04d}-02-29")


@SETTINGS
@given(
    st.tuples(two_digits, two_digits, st.sampled_from(["00", "59", "60", "61"]) | two_digits),
    st.sampled_from(["", ".5", ".123456", ".", ",5"]),
    st.sampled_from(["Z", "z", "", "+", "-", "Zz"]),
    st.tuples(two_digits, two_digits),
)
def test_time_and_date_time_are_exact(
    clock: tuple[str, str, str], fraction: str, zone: str, offset: tuple[str, str]
) -> None:
    if zone in ("+", "-"):
        zone += ":".join(offset)
    time = ":".join(clock) + fraction + zone
    assert_same_as_checker("time", time)
    assert_same_as_checker("date-time", f"2020-02-29T{time}")
    assert_same_as_checker("date-time", f"2021-02-29t{time}")


octets = st.sampled_from(["0", "00", "01", "1", "9", "10", "99", "100", "199", "200", "249"])
octets |= st.sampled_from(["250", "255", "256", "300", "999", "1000", "", "a", "1a", "٣"])


@SETTINGS
@given(st.lists(octets, min_size=1, max_size=5))
def test_ipv4_is_exact(parts: list[str]) -> None:
    assert_same_as_checker("ipv4", ".".join(parts))


UUID = (8, 4, 4, 4, 12)  # hex digits per group
hextets = st.sampled_from(["0", "1", "ab", "FFFF", "0000", "fFfF", "12345", "g", "", "1.2.3.4"])


@SETTINGS
@given(
    st.lists(hextets, max_size=10),
    st.integers(-1, 10),
    st.sampled_from(["", "1.2.3.4", "255.255.255.255", "01.2.3.4", "1.2.3", "%eth0"]),
)
def test_ipv6_is_exact(groups: list[str], compression: int, tail: str) -> None:
    parts = list(groups)
    if 0 <= compression <= len(parts):
        parts.insert(compression, "")  # "::" here
    text = ":".join(parts)
    if tail:
        text += tail if tail.startswith("%") else (":" if text else "") + tail
    assert_same_as_checker("ipv6", text)


@SETTINGS
@given(
    st.tuples(*(st.text("0123456789abcdefABCDEFg", min_size=n - 1, max_size=n + 1) for n in UUID)),
    st.sampled_from(["-", "", "--", "_"]),
)
def test_uuid_is_the_canonical_form_the_checker_accepts(
    groups: tuple[str, ...], hyphen: str
) -> None:
    text = hyphen.join(groups)
    canonical = hyphen == "-" and tuple(map(len, groups)) == UUID and "g" not in text
    assert format_matcher("uuid")(text) == canonical, text
    if canonical:  # narrower than the checker (braces, "urn:uuid:"), never wider
        assert CHECKER.conforms(text, "uuid"), text


@SETTINGS
@given(st.text(st.characters(codec="utf-8"), max_size=20))
def test_no_format_accepts_what_its_checker_refuses(text: str) -> None:
    for name in FORMATS:
        checked = name not in MISSING_CHECKERS and name not in FORMAT_GAPS
        if checked and format_matcher(name)(text):
            assert CHECKER.conforms(text, name), (name, text)


def needs_checker(name: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        name in MISSING_CHECKERS,
        reason=f"no {name} format checker: pip install 'jsonschema[format-nongpl]'",
    )


labels = st.sampled_from(["a", "Z", "0", "a-b", "xn--d1a", "-a", "a-", "a_b", "", "é", "%"])
labels |= st.sampled_from(["x" * 63, "x" * 64, "A1-2b"])


@needs_checker("hostname")
@SETTINGS
@given(st.lists(labels, min_size=1, max_size=4), st.booleans())
def test_hostname_is_exact_up_to_the_length_gap(parts: list[str], final_dot: bool) -> None:
    text = ".".join(parts) + ("." if final_dot else "")
    assume(len(text) <= 253)  # longer: the documented gap, tested below
    assert_same_as_checker("hostname", text)


@needs_checker("hostname")
def test_hostname_length_is_the_documented_gap() -> None:
    text = "a." * 126 + "ab"  # 254 characters of valid labels
    assert format_matcher("hostname")(text)
    assert not CHECKER.conforms(text, "hostname")
    assert "253" in FORMAT_GAPS["hostname"]


# fmt: off
schemes = st.sampled_from(["http", "h+t.p-1", "1http", "", "ht tp", "urn"])
authorities = st.sampled_from(["", "//", "//host", "//u:p@host:80", "//@h", "//h:x", "//[::1]",
                               "//[v1.a:b]", "//[V1.a]", "//[1::2::3]", "//[::1", "//%41b",
                               "//%4", "//a b", "//h/#"])
paths = st.sampled_from(["", "/", "/a/b", "a/b", "//x", "/a:b@c", "/%2F", "/é", "/a b", "/[x]"])
suffixes = st.sampled_from(["", "?", "?q=1&r=/?", "#", "#f/?", "?a#b", "#a#b", "?%zz", "#%20"])
# fmt: on


@needs_checker("uri")
@SETTINGS
@given(schemes, authorities, paths, suffixes)
def test_uri_is_exact(scheme: str, authority: str, path: str, suffix: str) -> None:
    assert_same_as_checker("uri", f"{scheme}:{authority}{path}{suffix}")
    assert_same_as_checker("uri", f"{scheme}{authority}{path}{suffix}")


units = st.sampled_from(["1Y", "2M", "3D", "4W", "T", "5H", "6M", "7S", "1.5S", "0Y", "-1D"])
units |= st.sampled_from(["D", "1", "08M", "10000S", "1d", "t"])


@needs_checker("duration")
@SETTINGS
@given(st.lists(units, max_size=6))
def test_duration_accepts_only_what_isoduration_accepts(parts: list[str]) -> None:
    text = "P" + "".join(parts)
    if format_matcher("duration")(text):
        assert CHECKER.conforms(text, "duration"), text
