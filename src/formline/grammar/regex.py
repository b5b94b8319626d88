"""Regular expression front end: a subset of Python ``re`` syntax to the grammar IR.

Supported: literals and escapes (``\\n \\t \\r \\f \\v \\xHH \\uHHHH \\UHHHHHHHH``, escaped
metacharacters), ``.`` (any character but newline), classes ``[a-z]``, ``[^...]`` with Unicode
ranges, ``\\d \\w \\s`` and their negations, groups ``(...)``, ``(?:...)``, ``(?P<name>...)``,
alternation, quantifiers ``* + ? {m} {m,} {m,n}`` (lazy forms accepted: laziness does not
change the language), and ``^``/``$`` at the ends of the pattern or of a top-level alternative.

``\\d``, ``\\w`` and ``\\s`` are ASCII, as in ECMA-262 and ``re.ASCII``: ``[0-9]``,
``[A-Za-z0-9_]`` and ``[ \\t\\n\\r\\f\\v]``. The whole pattern must match (``re.fullmatch``).

Unsupported constructs (lookaround, backreferences, ``\\b``, inline flags, anchors in the
middle) raise :class:`GrammarError` with the position instead of being ignored.

:class:`RegexParser` is the extension point for other dialects: a subclass overrides the hooks
(:meth:`~RegexParser.set_node`, :meth:`~RegexParser.literal_node`, ``DOT_EXCLUDES``,
:meth:`~RegexParser.parse_escape`, ...), and :meth:`~RegexParser.parse_branches` tells which
top-level alternatives are anchored (see :mod:`formline.schema.patterns` for ECMA-262).
"""

from __future__ import annotations

import re
from typing import ClassVar, NamedTuple

from formline.grammar.ir import (
    EMPTY,
    Choice,
    GrammarError,
    Literal,
    Node,
    Sequence,
)
from formline.grammar.nodes import repeat, require_utf8
from formline.grammar.utf8 import CodePointRanges, code_points_to_node, complement, normalize

DIGIT: CodePointRanges = [(0x30, 0x39)]
WORD: CodePointRanges = [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]
SPACE: CodePointRanges = [(0x09, 0x0D), (0x20, 0x20)]
CLASS_ESCAPES = {"d": DIGIT, "w": WORD, "s": SPACE}
SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a"}
OCTAL_DIGITS = "01234567"
# A brace quantifier as Python reads one: ASCII digits, no spaces ({ 2} and {2, 3} are
# literal text; they were repetitions). Matched where it starts: a scan to the next '}'
# from every '{' made "a{" * 100,000 + "}" take 6.8 s (28.9 s for twice as many).
BRACE_QUANTIFIER = re.compile(r"\{([0-9]*)(?:(,)([0-9]*))?\}")
MAX_REPEAT = 100_000  # a bound such as {0,1000000} is refused: the automaton would not fit.
# Groups nested deeper are refused. The parser recurses five frames per level, and a schema's
# pattern is parsed inside the schema compiler's own recursion (up to 64 levels): 200 nested
# groups overflowed Python's stack. Patterns seen in MaskBench nest at most 6 deep.
MAX_GROUP_DEPTH = 50


def parse_regex(pattern: str) -> Node:
    """Parse ``pattern`` into an IR node.

    Raises:
        GrammarError: malformed or unsupported syntax, with the character position.
    Costs O(len(pattern)).
    """
    require_utf8(pattern, "regex")
    try:
        return RegexParser(pattern).parse()
    except RecursionError:  # a caller already deep in the stack; the depth cap is the rule
        raise GrammarError("regex: the pattern is nested too deeply to parse") from None


class RegexBranch(NamedTuple):
    """One top-level alternative and whether it starts with ``^`` / ends with ``$``."""

    node: Node
    anchored_start: bool
    anchored_end: bool


class RegexParser:
    """Recursive-descent parser of one pattern (Python ``re`` dialect, raw UTF-8 output)."""

    DOT_EXCLUDES: ClassVar[CodePointRanges] = [(0x0A, 0x0A)]  # ``.`` is any character but these

    def __init__(self, pattern: str):
        self.pattern = pattern
        self.position = 0
        self.depth = 0  # group nesting: anchors are only understood at depth 0
        self.anchored_end = False

    def set_node(self, ranges: CodePointRanges) -> Node:
        """The node for one character out of ``ranges`` (hook: raw UTF-8 here)."""
        return code_points_to_node(ranges)

    def literal_node(self, character: str) -> Node:
        """The node for one literal character (hook: raw UTF-8 here)."""
        return Literal(character.encode("utf-8"))

    def error(self, message: str, position: int | None = None) -> GrammarError:
        where = self.position if position is None else position
        return GrammarError(f"regex: {message}", where, self.pattern)

    def peek(self) -> str | None:
        return self.pattern[self.position] if self.position < len(self.pattern) else None

    def take(self) -> str:
        if self.position >= len(self.pattern):
            raise self.error("unexpected end of pattern")
        character = self.pattern[self.position]
        self.position += 1
        return character

    def parse(self) -> Node:
        """The whole pattern with full-match semantics (anchors at the ends are no-ops)."""
        options = tuple(branch.node for branch in self.parse_branches())
        return options[0] if len(options) == 1 else Choice(options)

    def parse_branches(self) -> list[RegexBranch]:
        """The top-level alternatives with their anchors. Costs O(len(pattern))."""
        branches: list[RegexBranch] = []
        while True:
            anchored_start = self.peek() == "^"
            if anchored_start:
                self.position += 1
            self.anchored_end = False
            node = self.parse_sequence()
            branches.append(RegexBranch(node, anchored_start, self.anchored_end))
            if self.peek() != "|":
                break
            self.position += 1
        if self.position < len(self.pattern):
            if self.pattern[self.position] == ")":
                raise self.error("unbalanced ')'")
            raise self.error(f"unexpected {self.pattern[self.position]!r}")
        return branches

    def parse_alternation(self) -> Node:
        options = [self.parse_sequence()]
        while self.peek() == "|":
            self.position += 1
            options.append(self.parse_sequence())
        return options[0] if len(options) == 1 else Choice(tuple(options))

    def parse_sequence(self) -> Node:
        items: list[Node] = []
        while (character := self.peek()) is not None and character not in "|)":
            if character == "$":
                following = self.pattern[self.position + 1 : self.position + 2]
                if self.depth == 0 and following in ("", "|"):
                    self.position += 1
                    self.anchored_end = True
                    break
                raise self.error("'$' is only supported at the end of a top-level alternative")
            if character == "^":
                raise self.error("'^' is only supported at the start of a top-level alternative")
            items.append(self.parse_quantified())
        if not items:
            return EMPTY
        return items[0] if len(items) == 1 else Sequence(tuple(items))

    def parse_quantified(self) -> Node:
        node = self.parse_atom()
        while (character := self.peek()) is not None and character in "*+?{":
            bounds = self.parse_quantifier()
            if bounds is None:
                break
            node = repeat(node, bounds[0], bounds[1])
            if self.peek() == "?":  # lazy: same language
                self.position += 1
            elif self.peek() == "+":
                raise self.error("possessive quantifiers are not supported")
            following = self.peek()
            # A second quantifier, a brace one too: a{2}{3} was read as a{6}, where Python
            # and ECMA-262 both refuse it ("multiple repeat", "nothing to repeat").
            is_brace = following == "{" and self.is_brace_quantifier_at(self.position)
            if following is not None and (following in "*+?" or is_brace):
                raise self.error("multiple repeat")
        return node

    def is_brace_quantifier_at(self, position: int) -> bool:
        """Whether a quantifier in braces starts at ``position`` (Python's: ``{}`` is a
        literal, ``{,n}`` a quantifier); a dialect overrides it."""
        match = BRACE_QUANTIFIER.match(self.pattern, position)
        return match is not None and match.group() != "{}"

    def parse_quantifier(self) -> tuple[int, int | None] | None:
        character = self.take()
        if character == "*":
            return (0, None)
        if character == "+":
            return (1, None)
        if character == "?":
            return (0, 1)
        start = self.position - 1
        match = BRACE_QUANTIFIER.match(self.pattern, start)
        if match is None or match.group() == "{}":
            self.position = start  # Python treats a malformed brace as a literal '{'
            return None
        low, comma, high = match.groups(default="")
        # int() of a 5,000-digit count raised a bare ValueError (Python's 4,300-digit limit).
        if any(len(part.lstrip("0")) > len(str(MAX_REPEAT)) for part in (low, high)):
            raise self.error(f"repetition count above {MAX_REPEAT}", start)
        # Read without the leading zeros the length check dropped: "0" * 10,000 + "1" passed
        # it, and int() of the whole raised the same bare ValueError (a 500 in the server).
        minimum = int(low.lstrip("0") or "0") if low else 0
        maximum: int | None = (int(high.lstrip("0") or "0") if high else None) if comma else minimum
        if max(minimum, maximum or 0) > MAX_REPEAT:
            raise self.error(f"repetition count above {MAX_REPEAT}", start)
        if maximum is not None and maximum < minimum:
            raise self.error(f"min repeat greater than max repeat in {match.group()}", start)
        self.position = match.end()
        return (minimum, maximum)

    def parse_atom(self) -> Node:
        start = self.position
        character = self.take()
        if character == "(":
            return self.parse_group(start)
        if character == "[":
            return self.set_node(self.parse_class())
        if character == ".":
            return self.set_node(complement(self.DOT_EXCLUDES))
        if character == "\\":
            escaped = self.parse_escape(in_class=False)
            if isinstance(escaped, list):
                return self.set_node(escaped)
            return self.literal_node(escaped)
        if character in "*+?":
            raise self.error("nothing to repeat", start)
        if character == "{" and self.parse_brace_is_quantifier(start):
            raise self.error("nothing to repeat", start)
        return self.literal_node(character)

    def parse_brace_is_quantifier(self, start: int) -> bool:
        self.position = start
        bounds = self.parse_quantifier()
        if bounds is None:
            self.position = start + 1
            return False
        return True

    def parse_group(self, start: int) -> Node:
        if self.peek() == "?":
            self.position += 1
            self.parse_group_prefix(start)
        self.depth += 1
        if self.depth > MAX_GROUP_DEPTH:
            raise self.error(f"groups nested more than {MAX_GROUP_DEPTH} deep", start)
        node = self.parse_alternation()
        self.depth -= 1
        if self.peek() != ")":
            raise self.error("missing ')', unterminated group", start)
        self.position += 1
        return node

    def parse_group_prefix(self, start: int) -> None:
        """Consume what follows ``(?``: ``:`` or ``P<name>``; anything else is unsupported."""
        kind = self.take()
        if kind == "P" and self.peek() == "<":
            self.skip_group_name(start)
        elif kind != ":":
            raise self.error(f"unsupported group construct '(?{kind}'", start)

    def skip_group_name(self, start: int) -> None:
        closing = self.pattern.find(">", self.position)
        if closing < 0:
            raise self.error("unterminated group name", start)
        self.position = closing + 1

    def parse_escape(self, in_class: bool) -> str | CodePointRanges:
        start = self.position - 1
        character = self.take()
        if character.lower() in CLASS_ESCAPES:
            ranges = CLASS_ESCAPES[character.lower()]
            return complement(ranges) if character.isupper() else list(ranges)
        if character in SIMPLE_ESCAPES:
            return SIMPLE_ESCAPES[character]
        if character == "0":  # and up to two more octal digits, as Python: \012 is "\n"
            digits = "0"
            while len(digits) < 3 and (self.peek() or "x") in OCTAL_DIGITS:
                digits += self.take()
            return chr(int(digits, 8))
        if character == "b" and in_class:
            return "\b"
        hex_lengths = {"x": 2, "u": 4, "U": 8}
        if character in hex_lengths:
            digits = self.pattern[self.position : self.position + hex_lengths[character]]
            if len(digits) != hex_lengths[character] or not all(
                d in "0123456789abcdefABCDEF" for d in digits
            ):
                raise self.error(f"bad escape \\{character}{digits}", start)
            self.position += hex_lengths[character]
            value = int(digits, 16)
            if value > 0x10FFFF or 0xD800 <= value <= 0xDFFF:
                raise self.error(f"escape \\{character}{digits} is not a valid code point", start)
            return chr(value)
        if character.isalnum():
            raise self.error(f"unsupported escape \\{character}", start)
        return character

    def parse_class(self) -> CodePointRanges:
        start = self.position - 1
        negated = self.peek() == "^"
        if negated:
            self.position += 1
        ranges: CodePointRanges = []
        first = True
        while True:
            if self.peek() is None:
                raise self.error("unterminated character set", start)
            if self.peek() == "]" and not first:
                self.position += 1
                break
            first = False
            low = self.parse_class_item()
            if isinstance(low, list):
                ranges.extend(low)
                continue
            if self.peek() == "-" and self.pattern[self.position + 1 : self.position + 2] not in (
                "]",
                "",
            ):
                self.position += 1
                high = self.parse_class_item()
                if isinstance(high, list):
                    raise self.error("bad character range", start)
                if ord(high) < ord(low):
                    raise self.error(f"bad character range {low}-{high}", start)
                ranges.append((ord(low), ord(high)))
            else:
                ranges.append((ord(low), ord(low)))
        return complement(ranges) if negated else normalize(ranges)

    def parse_class_item(self) -> str | CodePointRanges:
        character = self.take()
        if character == "\\":
            return self.parse_escape(in_class=True)
        if character == "[" and self.peek() == ":":
            raise self.error("POSIX classes like [:alpha:] are not supported")
        return character
