"""JSON Schema ``format`` names to the IR of a JSON string body.

Each format is an ECMA-262 regular expression, compiled by :func:`~.patterns.pattern_node`
(anchored), so the characters come out JSON-encoded like every other string body. The
reference is ``jsonschema``'s draft 2020-12 format checker
(``Draft202012Validator.FORMAT_CHECKER``, jsonschema 4.26, with its optional packages
rfc3339-validator, fqdn, rfc3986-validator and isoduration): the grammar accepts every string
that checker accepts for real-world values, and no string it refuses, except what
:data:`FORMAT_GAPS` lists for an after-check. Without an optional package jsonschema checks
nothing for that format; the grammar still follows the RFC.

Exact as regular languages: ``date`` (month lengths and leap years: divisibility by 4, 100 and
400 is a property of the last digits), ``time`` and ``date-time`` (no leap second ``:60``,
``T``/``Z`` in either case, as rfc3339-validator), ``ipv4`` (no leading zeros, as
:mod:`ipaddress`), ``ipv6`` (RFC 3986's nine forms, no zone id), ``uuid`` (8-4-4-4-12 hex
digits), ``uri`` (RFC 3986 ``URI``, as rfc3986-validator), ``hostname`` but for its total
length. ``duration`` is RFC 3339 Appendix A with units skippable (``P1Y1D``), as ISO 8601 and
isoduration allow.

Narrower than the checker on purpose (:data:`FORMAT_NARROWER`): values that only a lenient
checker accepts and that no producer should emit.
"""

from __future__ import annotations

from functools import cache

from formline.grammar.ir import Node
from formline.schema.patterns import pattern_node

DIGIT = r"\d"
HEX = r"[0-9A-Fa-f]"

YEAR = r"(?:[1-9]\d{3}|0[1-9]\d{2}|00[1-9]\d|000[1-9])"  # 0001..9999
LEAP_FINAL_PAIR = r"(?:0[48]|[2468][048]|[13579][26])"  # a multiple of 4 but not 00
LEAP_YEAR = rf"(?:\d\d{LEAP_FINAL_PAIR}|{LEAP_FINAL_PAIR}00)"
MONTH_DAY = (
    r"(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])"
    r"|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)"
    r"|02-(?:0[1-9]|1\d|2[0-8]))"
)
DATE = rf"(?:{YEAR}-{MONTH_DAY}|{LEAP_YEAR}-02-29)"
HOUR = r"(?:[01]\d|2[0-3])"
TIME = rf"{HOUR}:[0-5]\d:[0-5]\d(?:\.\d+)?(?:[Zz]|[+-]{HOUR}:[0-5]\d)"

DURATION_DATE = r"(?:\d+Y(?:\d+M)?(?:\d+D)?|\d+M(?:\d+D)?|\d+D)"
DURATION_TIME = r"T(?:\d+H(?:\d+M)?(?:\d+S)?|\d+M(?:\d+S)?|\d+S)"
DURATION = rf"P(?:{DURATION_DATE}(?:{DURATION_TIME})?|{DURATION_TIME}|\d+W)"

OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
IPV4 = rf"{OCTET}(?:\.{OCTET}){{3}}"
H16 = rf"{HEX}{{1,4}}"
LS32 = rf"(?:{H16}:{H16}|{IPV4})"


def _ipv6() -> str:
    """RFC 3986 ``IPv6address``: nine forms, by how many groups may stand before ``::``."""
    forms = [rf"(?:{H16}:){{6}}{LS32}", rf"::(?:{H16}:){{5}}{LS32}"]
    tails = [rf"(?:{H16}:){{{4 - before}}}{LS32}" for before in range(4)] + [LS32, H16, ""]
    for before, tail in enumerate(tails):  # up to ``before + 1`` groups, then "::", then tail
        forms.append(rf"(?:(?:{H16}:){{0,{before}}}{H16})?::{tail}")
    return "(?:" + "|".join(forms) + ")"


IPV6 = _ipv6()

LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOSTNAME = rf"{LABEL}(?:\.{LABEL})*\.?"

ATOM_CHARACTER = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
QUOTED_LOCAL = r'"(?:[ !#-\[\]-~]|\\[ -~])*"'
EMAIL_DOMAIN = rf"(?:{LABEL}(?:\.{LABEL})*|\[{IPV4}\]|\[IPv6:{IPV6}\])"
EMAIL = rf"(?:{ATOM_CHARACTER}+(?:\.{ATOM_CHARACTER}+)*|{QUOTED_LOCAL})@{EMAIL_DOMAIN}"

UUID = rf"{HEX}{{8}}-{HEX}{{4}}-{HEX}{{4}}-{HEX}{{4}}-{HEX}{{12}}"

PERCENT_ENCODED = rf"%{HEX}{HEX}"
UNRESERVED_OR_SUB_DELIMITER = r"A-Za-z0-9\-._~!$&'()*+,;="
PATH_CHARACTER = rf"(?:[{UNRESERVED_OR_SUB_DELIMITER}:@]|{PERCENT_ENCODED})"
IP_LITERAL = rf"\[(?:{IPV6}|v{HEX}+\.[{UNRESERVED_OR_SUB_DELIMITER}:]+)\]"
REGISTERED_NAME = rf"(?:[{UNRESERVED_OR_SUB_DELIMITER}]|{PERCENT_ENCODED})*"
USER_INFORMATION = rf"(?:[{UNRESERVED_OR_SUB_DELIMITER}:]|{PERCENT_ENCODED})*"
AUTHORITY = rf"(?:{USER_INFORMATION}@)?(?:{IP_LITERAL}|{REGISTERED_NAME})(?::\d*)?"
SEGMENTS = rf"(?:/{PATH_CHARACTER}*)*"
HIERARCHICAL_PART = (
    rf"(?://{AUTHORITY}{SEGMENTS}|/(?:{PATH_CHARACTER}+{SEGMENTS})?|{PATH_CHARACTER}+{SEGMENTS})?"
)
QUERY = rf"(?:{PATH_CHARACTER}|[/?])*"
URI = rf"[A-Za-z][A-Za-z0-9+.\-]*:{HIERARCHICAL_PART}(?:\?{QUERY})?(?:#{QUERY})?"

FORMAT_PATTERNS: dict[str, str] = {
    "date": DATE,
    "time": TIME,
    "date-time": rf"{DATE}[Tt]{TIME}",
    "duration": DURATION,
    "email": EMAIL,
    "hostname": HOSTNAME,
    "ipv4": IPV4,
    "ipv6": IPV6,
    "uuid": UUID,
    "uri": URI,
}

FORMAT_GAPS: dict[str, str] = {
    "hostname": (
        "total length of at most 253 characters (254 with a final dot) is not in the grammar;"
        " the after-check needs the fqdn package"
    ),
}
"""Format -> what the grammar lets through that the checker refuses (an after-check catches
it). Every other format here is exact or narrower (see :data:`FORMAT_NARROWER`)."""

FORMAT_NARROWER: dict[str, str] = {
    "date-time": "a final newline (rfc3339-validator's '$') is refused",
    "time": "a final newline (rfc3339-validator's '$') is refused",
    "email": (
        "the checker accepts any string containing '@'; the grammar wants a dot-atom or quoted"
        " local part and a host name or [IPv4] / [IPv6:...] literal"
    ),
    "uuid": "uuid.UUID's braces, 'urn:uuid:' prefix, extra hyphens and '_' are refused",
    "duration": (
        "isoduration's extensions are refused: fractions (PT0.5S), signs (-P1D), exponents,"
        " weeks with other units (P1WT1H, P0Y1W)"
    ),
    "hostname": "fqdn's Unicode digits, case-folded matches (U+212A) and final newline",
    "uri": "rfc3986-validator's leading zeros in an IPv4 inside [IPv6] and final newline",
}
"""Format -> strings the checker accepts but the grammar refuses (none for everyday values)."""


def format_node(name: str) -> Node | None:
    """The JSON string bodies of the strings valid for format ``name``; ``None`` if unknown.

    Known: date, time, date-time, duration, email, hostname, ipv4, ipv6, uuid, uri. Raises
    nothing. The first call per format parses its regex (milliseconds); results are cached.
    """
    if name not in FORMAT_PATTERNS:
        return None
    return _format_node(name)


@cache
def _format_node(name: str) -> Node:
    return pattern_node(f"^(?:{FORMAT_PATTERNS[name]})$")


__all__ = ["FORMAT_GAPS", "FORMAT_NARROWER", "FORMAT_PATTERNS", "format_node"]
