"""Values copied from the source: plain strings and numbers restricted to what the text says.

A small model invents values: SmolLM2 reads "Lagos resident Chiamaka Eze marked her 29th
birthday" and writes ``"age": 23``; it fills a contract's ``parties`` with "The Supplier".
For extraction, where every name, city and amount is written in the source, ``verbatim=True``
narrows each plain ``string`` subschema (no ``enum``, ``const``, ``format`` or ``pattern``)
to the word-aligned spans of the source text (:func:`source_spans`) and each plain
``integer`` / ``number`` subschema to the numbers the text states, as digits or as words
(:func:`formline.pipeline.grounding.extract_numbers`: "29th" is 29, "a dozen" 12), as an
``enum`` beside its other keywords. A subschema with no candidate left (no number in the
text, or none within its bounds) is left as it is: the narrowing never makes a schema
unsatisfiable. The mask enforces the narrowed ``enum``; the after-check reads the schema as
given first, and reports what only the narrowed one refuses as "(the schema as compiled)".

It is the default of ``formline.extract`` (measured: docs/results/verbatim/), not of
``generate``, whose prompt need not be a source: a summary or a rationale becomes a span of
the text, and a value the text writes differently (a date, a currency code) must carry a
``format``, ``pattern`` or ``enum`` to stay free.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from formline.pipeline.grounding import extract_numbers
from formline.pipeline.tolerance import map_subschemas

MAX_SPAN_WORDS = 8  # a name, a city, a vendor, an item's description
MAX_SPANS = 4000  # about 500 words of source; past that, longer spans are dropped first
# Stripped from both ends of a span: "Porto Alegre," and "(Kraków)" are the places.
EDGE_PUNCTUATION = " \t\n,.;:!?()[]{}\"'“”‘’«»"
RESTRICTING = ("enum", "const", "format", "pattern")


def source_spans(source: str, max_words: int = MAX_SPAN_WORDS) -> list[str]:
    """Every run of 1 to ``max_words`` consecutive words of ``source`` (split on
    whitespace), punctuation stripped from its ends, once each, shorter runs first; at most
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
    return list(spans)


def source_numbers(source: str) -> list[Decimal]:
    """The numbers ``source`` states (digits or words), once each, in order."""
    return list(dict.fromkeys(extract_numbers(source)))


def verbatim_schema(schema: Any, source: str) -> Any:
    """``schema`` with every plain string and number subschema narrowed to the spans and
    numbers of ``source`` (see the module). The input is unchanged. Costs one walk of the
    schema plus :func:`source_spans`."""
    if not isinstance(schema, dict):
        return schema
    spans = source_spans(source)
    numbers = source_numbers(source)
    return map_subschemas(schema, lambda node: _narrow(node, spans, numbers))


def _narrow(node: dict[str, Any], spans: list[str], numbers: list[Decimal]) -> dict[str, Any]:
    if any(keyword in node for keyword in RESTRICTING):
        return node
    kinds = node.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds
    if not isinstance(kinds, list) or not kinds:
        return node
    nullable = "null" in kinds
    rest = [kind for kind in kinds if kind != "null"]
    if rest == ["string"]:
        candidates: list[Any] = [span for span in spans if _fits_length(node, span)]
    elif rest in (["integer"], ["number"]):
        candidates = _numbers_within(node, numbers, integer=rest == ["integer"])
    else:
        return node
    if not candidates:
        return node
    return {**node, "enum": [*candidates, None] if nullable else candidates}


def _fits_length(node: dict[str, Any], span: str) -> bool:
    minimum, maximum = node.get("minLength", 0), node.get("maxLength")
    return len(span) >= minimum and (maximum is None or len(span) <= maximum)


def _numbers_within(node: dict[str, Any], numbers: list[Decimal], integer: bool) -> list[Any]:
    found: list[Any] = []
    for number in numbers:
        if integer and number != number.to_integral_value():
            continue
        if not _within(node, number):
            continue
        value: Any = int(number) if number == number.to_integral_value() else float(number)
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
