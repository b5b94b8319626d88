"""ECMA-262 patterns rewritten as Python ``re`` patterns of the same language, for the checks
that run Python's ``re``: the after-check (``jsonschema`` searches ``pattern`` and
``patternProperties`` with ``re.search``) and the compiler's matching of declared property
names against ``patternProperties``.

Read by Python's ``re``, the pattern a schema holds means something else than what the
grammar enforces (:mod:`formline.schema.patterns`, ECMA-262 with the ``u`` flag, as JSON
Schema says). ``\\W`` let the grammar write ``é`` and the after-check refused it (Python's
``\\w`` is Unicode); ``\\s`` lets the grammar write U+FEFF, which Python's ``\\s`` does not
match; ``a{,3}`` is the literal text ``a{,3}`` in ECMA-262 and ``a{0,3}`` in Python; ``$``
also matches before a final newline in Python. Each output the grammar wrote there failed its
own after-check (and a declared name was given a pattern's schema it does not match).

So the pattern is parsed by the grammar's own ECMA-262 parser and written back with every
character class spelled out as code point ranges, ``\\A``/``\\Z`` for the anchors and
``(?:...)`` for the groups: the language is the grammar's, the engine that runs it is still
an independent one (the after-check stays a second opinion). A pattern the grammar cannot
read (lookahead, backreferences, ``\\b``) is left as it is, Python's reading the best there is.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from jsonschema import FormatChecker

from formline.grammar.ir import EMPTY, Choice, GrammarError, Node, Repeat, RuleReference, Sequence
from formline.grammar.utf8 import CodePointRanges, complement
from formline.schema.patterns import EcmaScriptParser

# Keywords whose value is one subschema, a map of names to subschemas, or a list of them;
# data keywords (const, enum, default, examples) are never rewritten.
SCHEMA_SINGLES = (
    "additionalProperties", "items", "additionalItems", "contains", "propertyNames", "not",
    "if", "then", "else", "unevaluatedItems", "unevaluatedProperties",
)  # fmt: skip
SCHEMA_MAPS = ("properties", "patternProperties", "dependentSchemas", "dependencies", "$defs",
               "definitions")  # fmt: skip
SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")


@lru_cache(maxsize=1024)
def python_pattern(pattern: str) -> str:
    """A Python ``re`` pattern that ``re.search`` matches in exactly the strings ECMA-262
    ``pattern`` (``u`` flag) matches, as the grammar reads it.

    Raises:
        GrammarError: ``pattern`` is malformed or uses what the grammar does not support.
    Costs O(len(pattern)) plus the class ranges written (a ``\\p{L}`` is about 650 ranges,
    13 kB of pattern text); cached for 1,024 patterns.
    """
    parser = _RangeParser(pattern)
    branches = []
    for branch in parser.parse_branches():
        start = "\\A" if branch.anchored_start else ""
        end = "\\Z" if branch.anchored_end else ""
        branches.append(f"{start}(?:{parser.write(branch.node)}){end}")
    return "|".join(branches)


def is_ecma_regex(instance: object) -> bool:
    """The ``regex`` format as ECMA-262 defines it: ``True`` for a non-string or a pattern
    the grammar reads; a pattern it cannot read (lookahead, a backreference) is judged by
    Python's ``re``. Python's own check refused ``\\p{Letter}`` and ``\\cC``, which JSON
    Schema allows and the grammar supports.

    Raises:
        re.error, OverflowError: Python cannot read it either (the format check's failure).
    Costs one parse of the pattern (cached)."""
    if not isinstance(instance, str):
        return True
    try:
        python_pattern(instance)
    except GrammarError:
        re.compile(instance)
    return True


def with_ecma_regex(checker: FormatChecker) -> FormatChecker:
    """A copy of ``checker`` whose ``regex`` format is :func:`is_ecma_regex`. Costs a copy of
    its table of formats (about 30 entries)."""
    copy = FormatChecker(formats=())
    copy.checkers = {**checker.checkers, "regex": (is_ecma_regex, re.error)}
    return copy


def python_pattern_or_same(pattern: str) -> str:
    """:func:`python_pattern`, or ``pattern`` itself where the grammar cannot read it."""
    try:
        return python_pattern(pattern)
    except GrammarError:
        return pattern


def is_pattern_match(pattern: str, name: str) -> bool:
    """Whether a patternProperties regex matches a declared name, read as ECMA-262 as the
    grammar reads it (:func:`python_pattern`); a pattern neither the
    grammar nor Python can read matches nothing here and the after-check decides. Costs one
    regex search (the translation is cached)."""
    try:
        return re.search(python_pattern_or_same(pattern), name) is not None
    except re.error:
        return False


def with_python_patterns(schema: Any) -> tuple[Any, dict[str, str]]:
    """A copy of ``schema`` whose ``pattern`` values and ``patternProperties`` names are
    rewritten by :func:`python_pattern_or_same`, and the map from each rewritten pattern to
    the original (to name the original in messages). Only schema positions are walked
    (``properties``, ``items``, ``allOf``, ``$defs``, ...); a pattern-shaped key inside
    ``const`` or ``enum`` is data and stays. ``schema`` is not changed.

    Costs one walk of the schema plus one translation per distinct pattern.
    """
    originals: dict[str, str] = {}
    return _rewrite(schema, originals), originals


def _rewrite(schema: Any, originals: dict[str, str]) -> Any:
    if not isinstance(schema, dict):
        return schema
    copy = dict(schema)
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        copy["pattern"] = _translated(pattern, originals)
    for keyword in SCHEMA_SINGLES:
        if isinstance(schema.get(keyword), dict):
            copy[keyword] = _rewrite(schema[keyword], originals)
    for keyword in SCHEMA_LISTS:
        if isinstance(schema.get(keyword), list):
            copy[keyword] = [_rewrite(item, originals) for item in schema[keyword]]
    for keyword in SCHEMA_MAPS:
        children = schema.get(keyword)
        if isinstance(children, dict):
            copy[keyword] = {name: _rewrite(sub, originals) for name, sub in children.items()}
    patterns = copy.get("patternProperties")
    if isinstance(patterns, dict):
        copy["patternProperties"] = {
            _translated(name, originals): sub for name, sub in patterns.items()
        }
    return copy


def _translated(pattern: str, originals: dict[str, str]) -> str:
    rewritten = python_pattern_or_same(pattern)
    originals[rewritten] = pattern
    return rewritten


class _RangeParser(EcmaScriptParser):
    """The ECMA-262 parser with each character (a literal or a class) kept as its code point
    ranges: a placeholder reference names its place in ``self.sets``."""

    def __init__(self, pattern: str):
        super().__init__(pattern)
        self.sets: list[CodePointRanges] = []

    def set_node(self, ranges: CodePointRanges) -> Node:
        self.sets.append(list(ranges))
        return RuleReference(str(len(self.sets) - 1))

    def literal_node(self, character: str) -> Node:
        return self.set_node([(ord(character), ord(character))])

    def write(self, node: Node) -> str:
        """The Python text of ``node`` (built by this parser: sets, sequences, choices,
        repeats and the empty string)."""
        if isinstance(node, RuleReference):
            return _class_text(self.sets[int(node.name)])
        if isinstance(node, Sequence):
            return "".join(self.write(item) for item in node.items)
        if isinstance(node, Choice):
            return "(?:" + "|".join(self.write(option) for option in node.options) + ")"
        if isinstance(node, Repeat):
            maximum = "" if node.maximum is None else str(node.maximum)
            return f"(?:{self.write(node.item)}){{{node.minimum},{maximum}}}"
        if node == EMPTY:
            return ""
        raise GrammarError(f"regex: no Python form for {type(node).__name__}")  # not reached


def _class_text(ranges: CodePointRanges) -> str:
    """One character out of ``ranges``: ``[]`` of ECMA-262 (no range) matches nothing, and a
    class with fewer ranges outside it than in is written negated (``.`` as ``[^\\n\\r...]``):
    spelled out, Python's ``re`` took 2.4 ms to compile ``^\\S+$`` (its charset tables walk
    the ranges), negated 0.1 ms. (Negated, a lone surrogate matches, as in ECMA-262.)"""
    if not ranges:
        return "(?!)"
    if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
        return re.escape(chr(ranges[0][0]))  # one character: itself
    missing = complement(ranges)
    if not missing:
        return "(?s:.)"
    if len(missing) < len(ranges):
        return "[^" + _ranges_text(missing) + "]"
    return "[" + _ranges_text(ranges) + "]"


def _ranges_text(ranges: CodePointRanges) -> str:
    return "".join(
        _code(low) if low == high else f"{_code(low)}-{_code(high)}" for low, high in ranges
    )


def _code(point: int) -> str:
    return f"\\U{point:08x}"
