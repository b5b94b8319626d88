"""Values copied from the source: plain strings, numbers and dates restricted to the text's.

A small model invents values: SmolLM2 reads "Lagos resident Chiamaka Eze marked her 29th
birthday" and writes ``"age": 23``; it fills a contract's ``parties`` with "The Supplier".
For extraction, where every name, city and amount is written in the source, ``verbatim=True``
narrows each plain ``string`` subschema (no ``enum``, ``const``, ``format`` or ``pattern``)
to the word-aligned spans of the source text (:func:`source_spans`) and each plain
``integer`` / ``number`` subschema to the numbers the text states, as digits or as words
(:func:`formline.pipeline.grounding.extract_numbers`: "29th" is 29, "a dozen" 12), as an
``enum`` beside its other keywords. A ``"format": "date"`` string (without a ``pattern``)
is narrowed to the dates the text states, written ``YYYY-MM-DD``
(:func:`formline.pipeline.dates.source_dates`: "the fifteenth of April 2025" is
``2025-04-15``; start dates right on 11 of 12 extraction-dev contracts, 2 of 12 before).
A subschema with no candidate left (no number in the text, or none within its bounds) is
left as it is: the narrowing never makes a schema unsatisfiable. Nor are strings narrowed for
a source past :data:`MAX_SPANS` spans (:func:`narrows_strings`). The mask enforces the
narrowed ``enum``; the after-check reads the schema as given first, and reports what only
the narrowed one refuses as "(the schema as compiled)". The string items of an array are
each written once (:func:`distinct_arrays`, enforced by
:class:`formline.mask.distinct.DistinctItemsMatcher`).

It is the default of ``formline.extract`` (measured: docs/results/verbatim/), not of
``generate``, whose prompt need not be a source: a summary or a rationale becomes a span of
the text, and a value the text writes differently (a currency code, a category) must carry
a ``format``, ``pattern`` or ``enum`` to stay free.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from formline.pipeline.dates import source_dates
from formline.pipeline.grounding import NUMBER_WORDS, extract_numbers
from formline.pipeline.tolerance import map_subschemas
from formline.schema.multiples import is_multiple_of

MAX_SPAN_WORDS = 8  # a name, a city, a vendor, an item's description
MAX_SPANS = 4000  # about 500 words of source; past that, strings are not narrowed
# Stripped from both ends of a span: "Porto Alegre," and "(Kraków)" are the places.
EDGE_PUNCTUATION = " \t\n,.;:!?()[]{}\"'“”‘’«»"
MAX_SCALE_STEPS = 10  # 1-10, 0-10, 1-5: a rating (see _is_scale)
# A minus sign or word right before digits, not inside a word or after one ("2020-2021",
# "COVID-19" are no negatives).
NEGATIVE_NUMBER = re.compile(
    r"(?:(?<![\w.,)\]])[-\u2212]|\b(?:minus|negative)\s+)([0-9]+(?:[.,][0-9]+)*)", re.IGNORECASE
)
# "minus seven", "negative twenty-one": the words after the sign, when the first is a
# number word (extract_numbers reads the number they spell).
NEGATIVE_WORDS = re.compile(r"\b(?:minus|negative)\s+([a-z]+(?:[\s-]+[a-z]+){0,5})", re.IGNORECASE)
MAX_NUMBER_DIGITS = 100  # a value's digits; an id may have 30 (see _is_short)
KEY_SEPARATORS = r"[=:]"  # inside a word: "uid=u_2048", "id:70921"
# distinct_arrays' walk: the 2,295 MaskBench schemas need 8 visits at the median; 4 need
# more than this (JsonSchemaStore's theme.json, 657,187), and past it arrays are not tracked.
MAX_SCHEMA_VISITS = 10_000


def source_spans(source: str, max_words: int = MAX_SPAN_WORDS) -> list[str]:
    """Every run of 1 to ``max_words`` consecutive words of ``source`` (split on
    whitespace), punctuation stripped from its ends, once each, shorter runs first, then
    what follows a ``=`` or ``:`` inside a word (``uid=bruna.s_2231``); at most
    :data:`MAX_SPANS`. Costs O(words x max_words) string joins."""
    words = source.split()
    spans: dict[str, None] = {}
    for length in range(1, max_words + 1):
        for start in range(len(words) - length + 1):
            span = " ".join(words[start : start + length]).strip(EDGE_PUNCTUATION)
            if span:
                spans[span] = None
            if len(spans) >= MAX_SPANS:
                return list(spans)
    for word in words:  # "[uid=bruna.s_2231]": the value after a key is a span of its own
        for part in re.split(KEY_SEPARATORS, word)[1:]:
            part = part.strip(EDGE_PUNCTUATION)
            if part and len(spans) < MAX_SPANS:
                spans[part] = None
    return list(spans)


def source_numbers(source: str) -> list[Decimal]:
    """The numbers ``source`` states (digits or words), once each, in order, then the
    negative ones: a magnitude written after a minus sign ("-7 C", "−250.50") or "minus" /
    "negative", in digits or words ("minus seven") (:func:`extract_numbers` reads
    magnitudes only, so "a low of -7" offered 7 and refused -7). A magnitude is kept beside
    its negative ("-" may be a dash). Numbers of more than :data:`MAX_NUMBER_DIGITS` digits
    are left out. Costs three passes over
    ``source``."""
    spelled = (
        match.group(1)
        for match in NEGATIVE_WORDS.finditer(source)
        if match.group(1).split()[0].split("-")[0].casefold() in NUMBER_WORDS
    )
    negatives = [
        -value
        for text in [*(m.group(1) for m in NEGATIVE_NUMBER.finditer(source)), *spelled]
        for value in extract_numbers(text)[:1]
    ]
    numbers = [*extract_numbers(source), *negatives]
    return [number for number in dict.fromkeys(numbers) if _is_short(number)]


def _is_short(number: Decimal) -> bool:
    """Whether ``number`` has at most :data:`MAX_NUMBER_DIGITS` digits before its point (a
    table of space-grouped digits read as one 6,000-digit number, an enum the compiler
    refused: past 4,000 digits)."""
    return not number or number.adjusted() < MAX_NUMBER_DIGITS


def narrows_strings(source: str) -> bool:
    """Whether :func:`verbatim_schema` narrows plain strings for ``source``: not when its
    spans pass :data:`MAX_SPANS` (about 500 words). Cut there, the enum held only the
    shorter spans: with 2,500 words "Maria Oliveira" near the end was gone, and the model
    was forced onto another span that passed grounding and the after-check alike; left
    free, a string the text does not hold is one grounding reports. Costs
    :func:`source_spans`."""
    return _narrowed_spans(source) is not None


def _narrowed_spans(source: str) -> list[str] | None:
    """:func:`source_spans`, or ``None`` past :data:`MAX_SPANS` (see :func:`narrows_strings`)."""
    spans = source_spans(source)
    return spans if len(spans) < MAX_SPANS else None


@dataclass(frozen=True)
class SourceValues:
    """What a source text offers a narrowed schema: its spans (``None``: too many to
    narrow strings, see :func:`narrows_strings`), numbers and dates."""

    spans: list[str] | None
    numbers: list[Decimal]
    dates: list[str]

    @classmethod
    def read(cls, source: str) -> SourceValues:
        return cls(_narrowed_spans(source), source_numbers(source), source_dates(source))


def verbatim_schema(schema: Any, source: str) -> Any:
    """``schema`` with every plain string and number subschema narrowed to the spans and
    numbers of ``source``, and every ``"format": "date"`` string to its dates (see the
    module). The input is unchanged. Costs one walk of the schema plus
    :func:`source_spans`."""
    if not isinstance(schema, dict):
        return schema
    values = SourceValues.read(source)
    return map_subschemas(schema, lambda node: _narrow(node, values))


def _narrow(node: dict[str, Any], values: SourceValues) -> dict[str, Any]:
    kinds = node.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds
    if not isinstance(kinds, list) or not kinds:
        return node
    nullable = "null" in kinds
    candidates = _candidates(node, [kind for kind in kinds if kind != "null"], values)
    if not candidates:
        return node
    return {**node, "enum": [*candidates, None] if nullable else candidates}


def _candidates(node: dict[str, Any], kinds: list[str], values: SourceValues) -> list[Any]:
    """What a subschema of these (non-null) ``kinds`` may be narrowed to; ``[]``: leave it.
    A date's own ``pattern`` says how it is written (maybe not ISO): left as it is."""
    if any(keyword in node for keyword in ("enum", "const", "pattern")):
        return []
    if kinds == ["string"] and node.get("format") == "date":
        return values.dates
    if "format" in node:
        return []
    if kinds == ["string"]:
        spans = values.spans or []  # too many spans: strings stay free (narrows_strings)
        return [span for span in spans if _fits_length(node, span)]
    if kinds == ["integer"] and _is_scale(node):
        return []  # a rating the model gives, not a number the text states
    if kinds in (["integer"], ["number"]):
        return _numbers_within(node, values.numbers, integer=kinds == ["integer"])
    return []


def _is_scale(node: dict[str, Any]) -> bool:
    """Whether an integer subschema is a scale (its bounds at most :data:`MAX_SCALE_STEPS`
    apart: "rate from 1 to 10"), taken for a judgement and not a number to find. Narrowed,
    extraction-dev's ``rate_skill_match`` could only be the years and counts its texts
    happen to state. A count bounded as tightly (bedrooms 0-10) is left free too."""
    low = _bound(node, "minimum", "exclusiveMinimum", 1)
    high = _bound(node, "maximum", "exclusiveMaximum", -1)
    return low is not None and high is not None and 0 <= high - low <= MAX_SCALE_STEPS


def _bound(node: dict[str, Any], inclusive: str, exclusive: str, step: int) -> float | None:
    """An integer's bound, inclusive (an exclusive bound moved by ``step``)."""
    for keyword, shift in ((inclusive, 0), (exclusive, step)):
        bound = node.get(keyword)
        if isinstance(bound, int | float) and not isinstance(bound, bool):
            return bound + shift
    return None


def _fits_length(node: dict[str, Any], span: str) -> bool:
    minimum, maximum = node.get("minLength", 0), node.get("maxLength")
    return len(span) >= minimum and (maximum is None or len(span) <= maximum)


def _numbers_within(node: dict[str, Any], numbers: list[Decimal], integer: bool) -> list[Any]:
    found: list[Any] = []
    step = node.get("multipleOf")
    if not isinstance(step, int | float) or isinstance(step, bool) or not 0 < step < math.inf:
        step = None
    for number in numbers:
        if integer and number != number.to_integral_value():
            continue
        if not _within(node, number):
            continue
        value: Any = int(number) if number == number.to_integral_value() else float(number)
        # As the schema compiler and the after-check judge a step (exactly: 19.99 is a
        # multiple of 0.01). Left in, a value the step refuses made the narrowed enum empty
        # (a valid schema unsatisfiable) or only null.
        if step is not None and not is_multiple_of(value, step):
            continue
        found.append(value)
    return list(dict.fromkeys(found))


def _within(node: dict[str, Any], number: Decimal) -> bool:
    checks = (
        ("minimum", lambda bound: number >= bound),
        ("maximum", lambda bound: number <= bound),
        ("exclusiveMinimum", lambda bound: number > bound),
        ("exclusiveMaximum", lambda bound: number < bound),
    )
    for keyword, holds in checks:
        bound = node.get(keyword)
        is_number = isinstance(bound, int | float) and not isinstance(bound, bool)
        if is_number and not holds(Decimal(str(bound))):
            return False
    return True


def distinct_arrays(schema: Any) -> dict[tuple[str, ...], list[str] | None]:
    """The arrays of ``schema`` whose items are strings, by path (object keys, ``"*"`` for
    array items), each with its items' ``enum`` strings (``None`` when free, or when
    ``anyOf`` / ``oneOf`` / ``allOf`` branches, which share their parent's path, disagree):
    what :class:`formline.mask.distinct.DistinctItemsMatcher` keeps distinct. A local
    ``$ref`` is not entered again inside its own expansion (a recursive schema's arrays are
    tracked at its first level). Costs one walk of the schema, at most
    :data:`MAX_SCHEMA_VISITS` subschemas."""
    collector = _ArrayCollector(schema if isinstance(schema, dict) else {})
    collector.visit(collector.root, ())
    for path in collector.mixed & collector.found.keys():
        collector.found[path] = None  # another array there takes other items: no enum
    return collector.found


class _ArrayCollector:
    """The walk of :func:`distinct_arrays`: its findings, the ``$ref`` s being expanded, a
    visit budget (two self-references per level made the walk exponential)."""

    def __init__(self, root: dict[str, Any]):
        self.root = root
        self.found: dict[tuple[str, ...], list[str] | None] = {}
        # Paths where an array's items are not plain strings (a branch's `items: {}`): the
        # items there need not be an enum's, so none is kept for them.
        self.mixed: set[tuple[str, ...]] = set()
        self.expanding: set[str] = set()
        self.visits = 0

    def visit(self, node: Any, path: tuple[str, ...]) -> None:
        self.visits += 1
        if not isinstance(node, dict) or self.visits > MAX_SCHEMA_VISITS:
            return
        reference = node.get("$ref")
        reference = reference if isinstance(reference, str) and reference[:2] == "#/" else ""
        if reference and reference not in self.expanding:
            self.expanding.add(reference)
            self.visit(_resolve(self.root, reference), path)
            self.expanding.discard(reference)
        for keyword in ("anyOf", "oneOf", "allOf"):
            for branch in node.get(keyword) or []:
                self.visit(branch, path)
        for name, sub in (node.get("properties") or {}).items():
            self.visit(sub, (*path, name))
        items = node.get("items")
        if isinstance(items, dict):
            if _is_string_schema(self.root, items):
                self.record(path, _enum_strings(self.root, items))
            else:
                self.mixed.add(path)
            self.visit(items, (*path, "*"))
        elif items is not None or _is_array_schema(node):  # `items: true`, or none: anything
            self.mixed.add(path)
        if "prefixItems" in node:  # its first items follow other schemas
            self.mixed.add(path)

    def record(self, path: tuple[str, ...], strings: list[str] | None) -> None:
        """Branches at one path that disagree leave its items free (only exact repeats are
        refused), so no branch's valid item is refused for another's enum."""
        if path in self.found and self.found[path] != strings:
            strings = None
        self.found[path] = strings


def _is_array_schema(node: dict[str, Any]) -> bool:
    declared = node.get("type")
    return declared == "array" or (isinstance(declared, list) and "array" in declared)


def _is_string_schema(root: dict[str, Any], node: dict[str, Any]) -> bool:
    return _resolve_once(root, node).get("type") == "string"


def _enum_strings(root: dict[str, Any], node: dict[str, Any]) -> list[str] | None:
    """A string schema's ``enum`` strings; ``None`` when it has none (free strings)."""
    enum = _resolve_once(root, node).get("enum")
    return [value for value in enum if isinstance(value, str)] if isinstance(enum, list) else None


def _resolve_once(root: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    reference = node.get("$ref")
    if isinstance(reference, str) and reference.startswith("#/"):
        resolved: dict[str, Any] = _resolve(root, reference)
        return resolved
    return node


def _resolve(root: dict[str, Any], reference: str) -> Any:
    node: Any = root
    for part in reference[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        node = node.get(part) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else {}
