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
read (lookahead, backreferences, ``\\b``), or whose Python form would pass 128 kB (each
``\\p{L}`` is 12 kB of ranges), is left as it is, Python's reading the best there is. The
rewrite matches ECMA-262 on every valid Unicode string; on a lone surrogate (which JSON can
carry and UTF-8 cannot) a negated class matches it, as ECMA-262 does, while the grammar
writes none.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any
from urllib.parse import quote, unquote

from jsonschema import FormatChecker

from formline.grammar.ir import EMPTY, Choice, GrammarError, Node, Repeat, RuleReference, Sequence
from formline.grammar.utf8 import CodePointRanges, complement
from formline.schema.patterns import EcmaScriptParser
from formline.schema.resolving import DATA_KEYWORDS, NAME_MAPS

# A Python form past this many characters is not made: "^" + "\\p{L}" * 400 + "$" (2 kB)
# became 4.9 MB that Python's re took 2 s to compile (the reviewer's case).
MAX_PYTHON_PATTERN = 128 * 1024
# Nesting the rewrite writes at most: "a" + "{1}" * 2000 nests 2,000 deep, past the
# interpreter's recursion here and Python's re parser there; groups alone stop at 50.
MAX_WRITE_DEPTH = 200
CLASS_CHARACTERS = 22  # the most a range takes written: \UXXXXXXXX-\UXXXXXXXX


def python_pattern(pattern: str) -> str:
    """A Python ``re`` pattern that ``re.search`` matches in exactly the strings ECMA-262
    ``pattern`` (``u`` flag) matches, as the grammar reads it.

    Raises:
        GrammarError: ``pattern`` is malformed, uses what the grammar does not support, or
            its Python form would pass :data:`MAX_PYTHON_PATTERN` characters.
    Costs O(len(pattern)) plus the class ranges written; cached (failures too) for 256
    patterns (at most 32 MB of forms).
    """
    result = _translation(pattern)
    if isinstance(result, GrammarError):
        raise result
    return result


@lru_cache(maxsize=256)
def _translation(pattern: str) -> str | GrammarError:
    parser = _RangeParser(pattern)
    try:
        branches = parser.parse_branches()
        size = sum(CLASS_CHARACTERS * min(len(s), len(complement(s))) for s in parser.sets)
        if size > MAX_PYTHON_PATTERN:
            return parser.error(f"its Python form would pass {MAX_PYTHON_PATTERN:,} characters")
        parts = []
        for branch in branches:
            start = "\\A" if branch.anchored_start else ""
            end = "\\Z" if branch.anchored_end else ""
            parts.append(f"{start}(?:{parser.write(branch.node)}){end}")
    except GrammarError as error:
        return error
    return "|".join(parts)


def is_ecma_regex(instance: object) -> bool:
    """The ``regex`` format: ``True`` for a non-string or a pattern the grammar reads as
    ECMA-262; a pattern it cannot read (lookahead, a backreference, but also Python-only
    syntax such as ``(?i)``) is judged by Python's ``re``. Python's own check refused
    ``\\p{Letter}`` and ``\\cC``, which JSON Schema allows and the grammar supports.

    Raises:
        re.error, OverflowError: Python cannot read it either (the format check's
            failure), nested too deep for it included.
    Costs one parse of the pattern (no Python form is written)."""
    if not isinstance(instance, str):
        return True
    try:
        _RangeParser(instance).parse_branches()
    except GrammarError:
        try:
            re.compile(instance)
        except RecursionError as error:
            # 600 nested groups: a RecursionError left the format check as a 500.
            raise re.error(f"Python cannot read the pattern either: {error}") from error
    return True


def with_ecma_regex(checker: FormatChecker) -> FormatChecker:
    """A copy of ``checker`` whose ``regex`` format is :func:`is_ecma_regex`. Costs a copy of
    its table of formats (about 30 entries)."""
    copy = FormatChecker(formats=())
    copy.checkers = {**checker.checkers, "regex": (is_ecma_regex, re.error)}
    return copy


def python_pattern_or_same(pattern: str) -> str:
    """:func:`python_pattern`, or ``pattern`` itself where it raises."""
    result = _translation(pattern)
    return pattern if isinstance(result, GrammarError) else result


def is_pattern_match(pattern: str, name: str) -> bool:
    """Whether a patternProperties regex matches a declared name, read as ECMA-262 as the
    grammar reads it (:func:`python_pattern`); a pattern neither the grammar nor Python can
    read matches nothing here and the after-check decides. Costs one regex search (the
    translation is cached)."""
    try:
        return re.search(python_pattern_or_same(pattern), name) is not None
    except re.error:
        return False


def with_python_patterns(schema: Any) -> tuple[Any, dict[str, str]]:
    """A copy of ``schema`` whose ``pattern`` values and ``patternProperties`` names are
    rewritten by :func:`python_pattern_or_same`, and the map from each rewritten pattern to
    its original (one to one: two spellings of one language, ``^[0-9]$`` and ``^\\d$``, get
    two forms, the second ending in ``(?:)``, so neither a ``patternProperties`` entry nor a
    message's pattern is lost). Every object is read as a schema but data (``const``,
    ``enum``, ``default``, ``examples``), so a ``$ref`` into ``#/components/...`` meets a
    rewritten pattern too; a same-document ``$ref`` through a renamed ``patternProperties``
    name is renamed with it. ``schema`` is not changed.

    Costs one walk of the schema plus one translation per distinct pattern.
    """
    rewriter = _Rewriter()
    copy = rewriter.walk(schema, None)
    rewriter.rename_references()
    return copy, rewriter.originals


class _Rewriter:
    """One schema's rewrite: its forms, the renamed maps and the references to revisit."""

    def __init__(self) -> None:
        self.originals: dict[str, str] = {}  # rewritten -> original
        self.rewritten: dict[str, str] = {}  # original -> rewritten
        self.pattern_maps: set[int] = set()  # ids of the rewritten patternProperties maps
        self.references: list[tuple[dict[str, Any], Any]] = []  # ($ref's schema, its resource)

    def walk(self, node: Any, resource: Any) -> Any:
        if isinstance(node, list):
            return [self.walk(item, resource) for item in node]
        if not isinstance(node, dict):
            return node
        copy: dict[str, Any] = {}
        if isinstance(node.get("$id"), str) or resource is None:
            resource = copy  # where a "#/..." pointer of this schema starts
        for key, value in node.items():
            if key in DATA_KEYWORDS:
                copy[key] = value
            elif key == "pattern" and isinstance(value, str):
                copy[key] = self.translated(value)
            elif key in NAME_MAPS and isinstance(value, dict):
                copy[key] = self.names(key, value, resource)
            else:
                copy[key] = self.walk(value, resource)
        if isinstance(node.get("$ref"), str) and node["$ref"].startswith("#/"):
            self.references.append((copy, resource))
        return copy

    def names(self, keyword: str, value: dict[str, Any], resource: Any) -> dict[str, Any]:
        children = {name: self.walk(sub, resource) for name, sub in value.items()}
        if keyword != "patternProperties":
            return children
        renamed = {self.translated(name): sub for name, sub in children.items()}
        self.pattern_maps.add(id(renamed))
        return renamed

    def translated(self, pattern: str) -> str:
        known = self.rewritten.get(pattern)
        if known is not None:
            return known
        form = python_pattern_or_same(pattern)
        while form in self.originals:  # another spelling of the same language
            form += "(?:)"
        self.originals[form] = pattern
        self.rewritten[pattern] = form
        return form

    def rename_references(self) -> None:
        """Each ``"#/..."`` reference through a renamed ``patternProperties`` name, renamed:
        ``#/patternProperties/^a`` pointed nowhere once ``^a`` had its Python name."""
        for schema, resource in self.references:
            node, parts = resource, []
            for part in schema["$ref"][2:].split("/"):
                name = unquote(part).replace("~1", "/").replace("~0", "~")
                if isinstance(node, dict) and id(node) in self.pattern_maps:
                    name = self.rewritten.get(name, name)
                    part = quote(name.replace("~", "~0").replace("/", "~1"), safe="")
                parts.append(part)
                node = _child(node, name)
            schema["$ref"] = "#/" + "/".join(parts)


def _child(node: Any, name: str) -> Any:
    if isinstance(node, dict):
        return node.get(name)
    if isinstance(node, list) and name.isdigit() and int(name) < len(node):
        return node[int(name)]
    return None


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

    def write(self, node: Node, depth: int = 0) -> str:
        """The Python text of ``node`` (built by this parser: sets, sequences, choices,
        repeats and the empty string).

        Raises:
            GrammarError: nested past :data:`MAX_WRITE_DEPTH`, a guard: groups stop at 50
                and a quantifier after another is refused ("multiple repeat")."""
        if depth > MAX_WRITE_DEPTH:
            raise self.error("the pattern is nested too deeply to rewrite")
        if isinstance(node, RuleReference):
            return _class_text(self.sets[int(node.name)])
        if isinstance(node, Sequence):
            return "".join(self.write(item, depth + 1) for item in node.items)
        if isinstance(node, Choice):
            options = (self.write(option, depth + 1) for option in node.options)
            return "(?:" + "|".join(options) + ")"
        if isinstance(node, Repeat):
            maximum = "" if node.maximum is None else str(node.maximum)
            return f"(?:{self.write(node.item, depth + 1)}){{{node.minimum},{maximum}}}"
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
