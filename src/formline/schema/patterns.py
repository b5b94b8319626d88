"""JSON Schema ``pattern`` (ECMA-262 regular expressions) to the IR of a JSON string body.

A JSON Schema string constraint is about the *decoded* string, but the grammar constrains the
JSON *text*, so every character here is produced in its JSON encoding, the bytes between the
quotes. The canonical encoding is the one of ``json.dumps(value, ensure_ascii=False)``: raw
UTF-8, except ``"`` -> ``\\"``, ``\\`` -> ``\\\\`` and the control characters U+0000..U+001F ->
``\\b \\f \\n \\r \\t`` or ``\\u00xx`` (lowercase hex). The nodes accept that encoding only
(never ``\\/``, ``\\u0041`` or a raw control character): a canonical encoding is unique per
string, which the schema compiler relies on to exclude property names exactly.

Patterns follow ECMA-262 with the ``u`` flag (what JSON Schema specifies): ``\\d`` and ``\\w``
are ASCII, ``\\s`` is the Unicode white space of ECMA-262, ``.`` is any character but the line
terminators ``\\n \\r \\u2028 \\u2029``, ``\\uXXXX`` (surrogate pairs combined), ``\\u{X...}``,
``\\xHH``, ``\\cX``, ``\\0``, ``(?<name>...)``, ``[]``/``[^]``, lazy quantifiers, ``{`` as a
literal when it is not a quantifier, and ``\\p{...}``/``\\P{...}`` for every Unicode general
category (``L``, ``Letter``, ``gc=Lu``, ``General_Category=Decimal_Number``, ``digit``, ...;
names match loosely, as UTS #18 recommends) plus ``Any``, ``ASCII`` and ``Assigned``. The
general categories come from Python's :mod:`unicodedata` (the Unicode version of the running
Python), computed once on first use (about 0.12 s).

Patterns are not anchored: ``abc`` matches any string that contains ``abc``. ``^`` and ``$``
are understood at the ends of the pattern and of its top-level alternatives (``^a|b$``).

Unsupported, raising :class:`~formline.grammar.ir.GrammarError` with the position: lookahead
and lookbehind, backreferences (``\\1``, ``\\k<name>``), ``\\b``/``\\B`` word boundaries, anchors
anywhere else, script and binary Unicode properties other than the three above.
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from functools import cache

from formline.grammar.ir import ByteSet, Choice, GrammarError, Literal, Node, Repeat, Sequence
from formline.grammar.regex import RegexParser
from formline.grammar.utf8 import (
    MAX_CODE_POINT,
    CodePointRanges,
    code_points_to_node,
    complement,
    normalize,
    remove_surrogates,
)

SHORT_ESCAPES = {0x08: b"\\b", 0x09: b"\\t", 0x0A: b"\\n", 0x0C: b"\\f", 0x0D: b"\\r"}
ESCAPED_CHARACTERS = {0x22: b'\\"', 0x5C: b"\\\\"}
LAST_CONTROL = 0x1F
NEEDS_ESCAPE: CodePointRanges = [(0x00, LAST_CONTROL), (0x22, 0x22), (0x5C, 0x5C)]

ECMA_SPACE: CodePointRanges = normalize(
    [(0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A)]
    + [(0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF)]
)
LINE_TERMINATORS: CodePointRanges = [(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)]
HEX_DIGITS = frozenset("0123456789abcdefABCDEF")

# General categories: (short name, long name, other aliases) from PropertyValueAliases.txt.
GENERAL_CATEGORY_NAMES: tuple[tuple[str, ...], ...] = (
    ("C", "Other"), ("Cc", "Control", "cntrl"), ("Cf", "Format"), ("Cn", "Unassigned"),
    ("Co", "Private_Use"), ("Cs", "Surrogate"), ("L", "Letter"), ("LC", "Cased_Letter"),
    ("Ll", "Lowercase_Letter"), ("Lm", "Modifier_Letter"), ("Lo", "Other_Letter"),
    ("Lt", "Titlecase_Letter"), ("Lu", "Uppercase_Letter"), ("M", "Mark", "Combining_Mark"),
    ("Mc", "Spacing_Mark"), ("Me", "Enclosing_Mark"), ("Mn", "Nonspacing_Mark"),
    ("N", "Number"), ("Nd", "Decimal_Number", "digit"), ("Nl", "Letter_Number"),
    ("No", "Other_Number"), ("P", "Punctuation", "punct"), ("Pc", "Connector_Punctuation"),
    ("Pd", "Dash_Punctuation"), ("Pe", "Close_Punctuation"), ("Pf", "Final_Punctuation"),
    ("Pi", "Initial_Punctuation"), ("Po", "Other_Punctuation"), ("Ps", "Open_Punctuation"),
    ("S", "Symbol"), ("Sc", "Currency_Symbol"), ("Sk", "Modifier_Symbol"), ("Sm", "Math_Symbol"),
    ("So", "Other_Symbol"), ("Z", "Separator"), ("Zl", "Line_Separator"),
    ("Zp", "Paragraph_Separator"), ("Zs", "Space_Separator"),
)  # fmt: skip
CATEGORY_PROPERTY_KEYS = ("gc", "generalcategory")


def json_string_character(ranges: CodePointRanges) -> Node:
    """One character out of ``ranges`` (code points), as it appears inside a JSON string.

    Accepts exactly the canonical encoding of ``json.dumps(ensure_ascii=False)`` of every code
    point of the set. Surrogates are dropped (they are not UTF-8); an empty set gives a node
    matching nothing (an empty choice).
    Costs O(number of ranges); results are cached per set.
    """
    return _json_string_character(tuple(remove_surrogates(normalize(ranges))))


@cache
def _json_string_character(ranges: tuple[tuple[int, int], ...]) -> Node:
    options: list[Node] = []
    raw = _subtract(list(ranges), NEEDS_ESCAPE)
    if len(raw) == 1 and raw[0][0] == raw[0][1]:
        options.append(Literal(chr(raw[0][0]).encode("utf-8")))
    elif raw:
        options.append(code_points_to_node(raw))
    for code, escape in itertools.chain(SHORT_ESCAPES.items(), ESCAPED_CHARACTERS.items()):
        if _contains(ranges, code):
            options.append(Literal(escape))
    controls = [
        c for c in range(LAST_CONTROL + 1) if c not in SHORT_ESCAPES and _contains(ranges, c)
    ]
    for high in (0, 1):
        lows = [ord(f"{code & 0xF:x}") for code in controls if code >> 4 == high]
        if lows:
            hex_low = ByteSet(tuple(normalize([(low, low) for low in lows])))
            options.append(Sequence((Literal(f"\\u00{high}".encode()), hex_low)))
    if len(options) == 1:
        return options[0]
    return Choice(tuple(options))


def _contains(ranges: tuple[tuple[int, int], ...], code: int) -> bool:
    return any(low <= code <= high for low, high in ranges)


def _subtract(ranges: CodePointRanges, removed: CodePointRanges) -> CodePointRanges:
    """``ranges`` minus ``removed`` (both code point sets)."""
    kept = complement(removed)  # complement drops surrogates, which are never wanted here
    result: CodePointRanges = []
    for low, high in normalize(ranges):
        for keep_low, keep_high in kept:
            if keep_low <= high and low <= keep_high:
                result.append((max(low, keep_low), min(high, keep_high)))
    return result


@cache
def any_json_character() -> Node:
    """Any one character of a JSON string body (``[\\s\\S]``). Made once: normalising its
    ranges again cost 0.30 µs a call, compiled, once per string value (0.02 µs now)."""
    return json_string_character([(0, MAX_CODE_POINT)])


def length_node(minimum: int, maximum: int | None) -> Node:
    """Any JSON string body of ``minimum`` to ``maximum`` characters (``None``: no maximum).

    Characters are code points, as JSON Schema's ``minLength``/``maxLength`` count them.

    Raises:
        GrammarError: negative ``minimum`` or ``maximum < minimum``.
    Costs O(1) here; the automaton grows linearly with the bounds (the automaton layer
    enforces its state limits).
    """
    return Repeat(any_json_character(), minimum, maximum)


def pattern_node(pattern: str) -> Node:
    """The JSON string bodies of every string that ECMA-262 ``pattern`` matches (unanchored).

    Raises:
        GrammarError: malformed or unsupported syntax, with the character position in
            ``pattern`` (see the module docstring for what is supported).
    Costs O(len(pattern)) plus, on the first ``\\p{...}``, the one-off Unicode table (~0.12 s).
    The IR is linear in the pattern; bounded repetitions are expanded later by the automata,
    which enforce their own state limits.
    """
    anything = Repeat(any_json_character(), 0, None)
    options: list[Node] = []
    for branch in EcmaScriptParser(pattern).parse_branches():
        items = [branch.node]
        if not branch.anchored_start:
            items.insert(0, anything)
        if not branch.anchored_end:
            items.append(anything)
        options.append(items[0] if len(items) == 1 else Sequence(tuple(items)))
    return options[0] if len(options) == 1 else Choice(tuple(options))


class EcmaScriptParser(RegexParser):
    """The ECMA-262 (``u`` flag) dialect, producing JSON-encoded characters."""

    DOT_EXCLUDES = LINE_TERMINATORS

    def set_node(self, ranges: CodePointRanges) -> Node:
        return json_string_character(ranges)

    def literal_node(self, character: str) -> Node:
        return json_string_character([(ord(character), ord(character))])

    def is_brace_quantifier_at(self, position: int) -> bool:
        return _is_brace_quantifier(self.pattern, position)

    def parse_quantifier(self) -> tuple[int, int | None] | None:
        if self.peek() == "{" and not _is_brace_quantifier(self.pattern, self.position):
            return None  # ECMA-262 Annex B: a literal '{' ({,n} is not a quantifier either)
        return super().parse_quantifier()

    def parse_class(self) -> CodePointRanges:
        if self.pattern.startswith("]", self.position):
            self.position += 1
            return []  # [] matches nothing
        if self.pattern.startswith("^]", self.position):
            self.position += 2
            return complement([])  # [^] matches any character
        return super().parse_class()

    def parse_group_prefix(self, start: int) -> None:
        following = self.pattern[self.position + 1 : self.position + 2]
        if self.peek() == "<" and following not in ("=", "!"):
            self.position += 1
            self.skip_group_name(start)
            return
        if self.peek() in ("=", "!", "<"):
            raise self.error("lookahead and lookbehind are not supported", start)
        if self.peek() != ":":
            raise self.error(f"unsupported group construct '(?{self.peek() or ''}'", start)
        super().parse_group_prefix(start)

    def parse_escape(self, in_class: bool) -> str | CodePointRanges:
        start = self.position - 1
        character = self.peek()
        if character in ("s", "S"):
            self.position += 1
            return list(ECMA_SPACE) if character == "s" else complement(ECMA_SPACE)
        if character in ("p", "P"):
            self.position += 1
            ranges = self.parse_property(start)
            return ranges if character == "p" else complement(ranges)
        if character == "u":
            self.position += 1
            return self.parse_unicode_escape(start)
        if character == "c":
            letter = self.pattern[self.position + 1 : self.position + 2]
            if not (letter.isascii() and letter.isalpha()):
                raise self.error("\\c must be followed by an ASCII letter", start)
            self.position += 2
            return chr(ord(letter) % 32)
        if character == "0" and self.pattern[self.position + 1 : self.position + 2].isdigit():
            raise self.error("octal escapes are not supported", start)
        if character in ("b", "B") and not in_class:
            raise self.error("word boundary assertions \\b and \\B are not supported", start)
        if character is not None and (character in "123456789" or character == "k"):
            raise self.error("backreferences are not supported", start)
        if character in ("a", "U", "A", "Z", "z"):
            raise self.error(f"unsupported escape \\{character}", start)
        return super().parse_escape(in_class)

    def parse_unicode_escape(self, start: int) -> str:
        """After ``\\u``: ``{X...}`` or four hex digits, combining a surrogate pair."""
        if self.peek() == "{":
            closing = self.pattern.find("}", self.position)
            digits = self.pattern[self.position + 1 : closing] if closing > 0 else ""
            if not digits or not HEX_DIGITS.issuperset(digits) or int(digits, 16) > MAX_CODE_POINT:
                raise self.error("bad escape \\u{...}", start)
            self.position = closing + 1
            return chr(int(digits, 16))
        value = self.take_hex(4, start)
        if 0xD800 <= value <= 0xDBFF and self.pattern.startswith("\\u", self.position):
            low_digits = self.pattern[self.position + 2 : self.position + 6]
            if len(low_digits) == 4 and HEX_DIGITS.issuperset(low_digits):
                low = int(low_digits, 16)
                if 0xDC00 <= low <= 0xDFFF:
                    self.position += 6
                    return chr(0x10000 + ((value - 0xD800) << 10) + (low - 0xDC00))
        return chr(value)  # a lone surrogate: matches nothing (no UTF-8 string contains it)

    def take_hex(self, count: int, start: int) -> int:
        digits = self.pattern[self.position : self.position + count]
        if len(digits) != count or not HEX_DIGITS.issuperset(digits):
            raise self.error(f"bad escape \\u{digits}", start)
        self.position += count
        return int(digits, 16)

    def parse_property(self, start: int) -> CodePointRanges:
        """After ``\\p``/``\\P``: ``{Name}`` or ``{Key=Value}`` to code point ranges."""
        closing = self.pattern.find("}", self.position)
        if self.peek() != "{" or closing < 0:
            raise self.error("\\p must be followed by {property}", start)
        text = self.pattern[self.position + 1 : closing]
        self.position = closing + 1
        key, _, value = text.rpartition("=")
        if key and _loose(key) not in CATEGORY_PROPERTY_KEYS:
            raise self.error(f"unsupported Unicode property {text!r}", start)
        ranges = unicode_property_ranges(value, general_category_only=bool(key))
        if ranges is None:
            raise self.error(f"unsupported Unicode property {text!r}", start)
        return ranges


def _is_brace_quantifier(pattern: str, position: int) -> bool:
    """Whether ``pattern[position:]`` starts with ``{n}``, ``{n,}`` or ``{n,m}`` (ASCII
    digits only). Matched in place: a scan to the next '}' from every '{' was quadratic."""
    return ECMA_BRACE_QUANTIFIER.match(pattern, position) is not None


ECMA_BRACE_QUANTIFIER = re.compile(r"\{[0-9]+(?:,[0-9]*)?\}")


def _loose(name: str) -> str:
    """UTS #18 loose matching: ignore case, spaces, hyphens and underscores."""
    return "".join(c for c in name.lower() if c not in " -_")


def unicode_property_ranges(
    name: str, general_category_only: bool = False
) -> CodePointRanges | None:
    """The code points of Unicode property ``name`` (loose match), or ``None`` if unsupported.

    Supported: every general category (short or long name or alias) and, unless
    ``general_category_only``, ``Any``, ``ASCII`` and ``Assigned``. Raises nothing. The first
    call builds the general category table from :mod:`unicodedata` (about 0.12 s), later
    calls cost O(result).
    """
    loose = _loose(name)
    if not general_category_only:
        if loose == "any":
            return [(0, MAX_CODE_POINT)]
        if loose == "ascii":
            return [(0, 0x7F)]
        if loose == "assigned":
            return complement(_category_table()["Cn"])
    for names in GENERAL_CATEGORY_NAMES:
        if loose in {_loose(alias) for alias in names}:
            table = _category_table()
            short = names[0]
            if short == "LC":
                return normalize(table["Lu"] + table["Ll"] + table["Lt"])
            return normalize(
                [r for cat, ranges in table.items() if cat.startswith(short) for r in ranges]
            )
    return None


@cache
def _category_table() -> dict[str, CodePointRanges]:
    """Two-letter general category -> code point ranges, over all of Unicode (computed once)."""
    categories = map(unicodedata.category, map(chr, range(MAX_CODE_POINT + 1)))
    table: dict[str, CodePointRanges] = {}
    start = 0
    for category, group in itertools.groupby(categories):
        count = sum(1 for _ in group)
        table.setdefault(category, []).append((start, start + count - 1))
        start += count
    return table


__all__ = [
    "EcmaScriptParser",
    "GrammarError",
    "any_json_character",
    "json_string_character",
    "length_node",
    "pattern_node",
    "unicode_property_ranges",
]
