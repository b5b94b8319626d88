"""EBNF front end: formline's grammar text format, a superset of llama.cpp's GBNF.

The format, one rule per definition::

    # a comment runs to the end of the line
    root   ::= object
    object ::= "{" ( pair ( "," pair )* )? "}"
    pair   ::= string ":" value
    string ::= "\\"" [^"\\\\]* "\\""
    number ::= /-?(0|[1-9][0-9]*)/        # a /regex/ terminal (formline extension)

Elements: ``"literal"`` (escapes ``\\n \\t \\r \\\\ \\" \\xHH \\uHHHH \\UHHHHHHHH``),
``[character class]`` with ranges and ``^`` negation, ``.`` (any character), rule names
(letters, digits, ``-``, ``_``), parentheses, ``|``, and the postfix operators ``? * +``,
``{m}``, ``{m,}``, ``{m,n}``. ``/regex/`` terminals use :mod:`formline.grammar.regex` syntax;
they are refused in GBNF mode. Newlines are whitespace: a rule ends where the next
``name ::=`` begins, so every GBNF layout parses. Recursion is allowed, left recursion is not
(refused at compile time, as llama.cpp does).
"""

from __future__ import annotations

import re

from formline.grammar.ir import (
    EMPTY,
    Choice,
    GrammarError,
    Literal,
    Node,
    Repeat,
    RuleReference,
    Sequence,
)
from formline.grammar.nodes import repeat, require_utf8
from formline.grammar.regex import MAX_GROUP_DEPTH, MAX_REPEAT, parse_regex
from formline.grammar.utf8 import CodePointRanges, code_points_to_node, complement, normalize

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")
_SPACE = re.compile(r"(?:\s+|#[^\n]*)+")
_LINE_SPACE = re.compile(r"(?:[ \t]+|#[^\n]*)+")  # a rule's own line: no newline
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-"}
_ESCAPES.update({"/": "/", "^": "^", "0": "\0", "f": "\f", "v": "\v", "'": "'"})
_HEX_LENGTHS = {"x": 2, "u": 4, "U": 8}


def parse_ebnf(text: str, allow_regex: bool = True) -> dict[str, Node]:
    """Parse a grammar text into ``{rule name: body}``.

    Raises:
        GrammarError: malformed text, a rule defined twice, or a ``/regex/`` in GBNF mode;
            the error carries the character position (and line and column in the message).
    Costs O(len(text)).
    """
    require_utf8(text, "grammar")
    try:
        return _EbnfParser(text, allow_regex).parse()
    except RecursionError:  # a caller already deep in the stack; the depth cap is the rule
        raise GrammarError("grammar: the text is nested too deeply to parse") from None


class _EbnfParser:
    def __init__(self, text: str, allow_regex: bool):
        self.text = text
        self.allow_regex = allow_regex
        self.position = 0
        self.depth = 0  # parentheses open (see MAX_GROUP_DEPTH)
        self.references: dict[str, int] = {}  # each referenced name's first position

    def error(self, message: str, position: int | None = None) -> GrammarError:
        where = self.position if position is None else position
        return GrammarError(f"grammar: {message}", where, self.text)

    def skip_space(self) -> None:
        match = _SPACE.match(self.text, self.position)
        if match:
            self.position = match.end()

    def peek(self) -> str:
        return self.text[self.position] if self.position < len(self.text) else ""

    def at_rule_start(self) -> bool:
        match = _NAME.match(self.text, self.position)
        if not match:
            return False
        after = _SPACE.match(self.text, match.end())
        end = after.end() if after else match.end()
        return self.text.startswith("::=", end)

    def parse(self) -> dict[str, Node]:
        rules: dict[str, Node] = {}
        self.skip_space()
        if self.position >= len(self.text):
            raise self.error("the grammar has no rules")
        while self.position < len(self.text):
            start = self.position
            match = _NAME.match(self.text, self.position)
            if not match or not self.at_rule_start():
                raise self.error("expected a rule definition 'name ::= ...'")
            name = match.group()
            if name in rules:
                raise self.error(f"rule {name!r} is defined twice", start)
            self.position = match.end()
            self.skip_space()
            self.position += 3
            self.skip_space()
            rules[name] = self.parse_alternation(nested=False)
            self.skip_space()
        for reference, position in self.references.items():
            if reference not in rules:  # here the error can point at the reference
                raise self.error(f"rule {reference!r} is not defined", position)
        return rules

    def parse_alternation(self, nested: bool) -> Node:
        options = [self.parse_sequence(nested)]
        while self.peek() == "|":
            self.position += 1
            self.skip_space()
            options.append(self.parse_sequence(nested))
        return options[0] if len(options) == 1 else Choice(tuple(options))

    def parse_sequence(self, nested: bool) -> Node:
        items: list[Node] = []
        while True:
            self.skip_space()
            character = self.peek()
            if character in ("", "|", ")") or (not nested and self.at_rule_start()):
                break
            items.append(self.parse_postfix(self.parse_primary(), nested))
        if not items:
            return EMPTY
        return items[0] if len(items) == 1 else Sequence(tuple(items))

    def parse_postfix(self, node: Node, nested: bool = True) -> Node:
        while True:
            # llama.cpp skips spaces (newlines too inside parentheses) and comments after an
            # element, so '"a" *' is a repetition: it was "unexpected '*'".
            gap = (_SPACE if nested else _LINE_SPACE).match(self.text, self.position)
            after = gap.end() if gap else self.position
            if self.text[after : after + 1] in ("*", "+", "?", "{"):
                self.position = after
            character = self.peek()
            if character == "*":
                node = Repeat(node, 0, None)
            elif character == "+":
                node = Repeat(node, 1, None)
            elif character == "?":
                node = Repeat(node, 0, 1)
            elif character == "{":
                node = self.parse_braces(node)
                continue
            else:
                return node
            self.position += 1

    def parse_braces(self, node: Node) -> Node:
        start = self.position
        closing = self.text.find("}", start)
        body = re.sub(r"\s", "", self.text[start + 1 : closing]) if closing > 0 else ""
        match = re.fullmatch(r"(\d+)(,(\d*))?", body)
        if closing < 0 or not match:
            raise self.error("malformed repetition, expected {m}, {m,} or {m,n}", start)
        # int() of a 5,000-digit count raised a bare ValueError (Python's 4,300-digit limit).
        if any(
            len((count or "").lstrip("0")) > len(str(MAX_REPEAT)) for count in match.groups()[::2]
        ):
            raise self.error(f"repetition count above {MAX_REPEAT}", start)
        # Read without the leading zeros the length check dropped (int() of "0" * 10,000 +
        # "1" raised a bare ValueError).
        minimum = int(match.group(1).lstrip("0") or "0")
        maximum: int | None = minimum
        if match.group(2):
            maximum = int(match.group(3).lstrip("0") or "0") if match.group(3) else None
        if max(minimum, maximum or 0) > MAX_REPEAT:
            raise self.error(f"repetition count above {MAX_REPEAT}", start)
        if maximum is not None and maximum < minimum:
            raise self.error(f"repetition {{{body}}} has max below min", start)
        self.position = closing + 1
        return repeat(node, minimum, maximum)

    def parse_primary(self) -> Node:
        start = self.position
        character = self.peek()
        if character == '"':
            self.position += 1
            return Literal(self.parse_quoted('"', start).encode("utf-8"))
        if character == "[":
            self.position += 1
            return code_points_to_node(self.parse_class(start))
        if character == ".":
            self.position += 1
            return code_points_to_node(complement([]))
        if character == "(":
            self.position += 1
            self.depth += 1
            if self.depth > MAX_GROUP_DEPTH:
                raise self.error(f"parentheses nested more than {MAX_GROUP_DEPTH} deep", start)
            node = self.parse_alternation(nested=True)
            self.depth -= 1
            self.skip_space()
            if self.peek() != ")":
                raise self.error("missing ')'", start)
            self.position += 1
            return node
        if character == "/":
            return self.parse_regex_terminal(start)
        match = _NAME.match(self.text, self.position)
        if match:
            self.position = match.end()
            self.references.setdefault(match.group(), start)
            return RuleReference(match.group())
        if character == "<":
            raise self.error("token references like <[id]> are not supported")
        raise self.error(f"unexpected {character!r}")

    def parse_regex_terminal(self, start: int) -> Node:
        if not self.allow_regex:
            raise self.error("/regex/ terminals are not part of GBNF", start)
        position = start + 1
        while position < len(self.text) and self.text[position] != "/":
            position += 2 if self.text[position] == "\\" else 1
        if position >= len(self.text):
            raise self.error("unterminated /regex/", start)
        pattern = self.text[start + 1 : position]
        self.position = position + 1
        try:
            return parse_regex(pattern)
        except GrammarError as error:
            offset = start + 1 + (error.position or 0)
            raise self.error(error.message, offset) from None

    def parse_escape(self) -> str:
        start = self.position - 1
        character = self.text[self.position : self.position + 1]
        self.position += 1
        if character in _ESCAPES:
            return _ESCAPES[character]
        if character in _HEX_LENGTHS:
            digits = self.text[self.position : self.position + _HEX_LENGTHS[character]]
            if len(digits) != _HEX_LENGTHS[character] or not re.fullmatch(r"[0-9a-fA-F]+", digits):
                raise self.error(f"bad escape \\{character}{digits}", start)
            self.position += len(digits)
            value = int(digits, 16)
            if value > 0x10FFFF or 0xD800 <= value <= 0xDFFF:
                raise self.error(f"\\{character}{digits} is not a valid code point", start)
            return chr(value)
        raise self.error(f"unknown escape \\{character}", start)

    def parse_quoted(self, quote: str, start: int) -> str:
        characters: list[str] = []
        while True:
            if self.position >= len(self.text):
                raise self.error("unterminated string literal", start)
            character = self.text[self.position]
            self.position += 1
            if character == quote:
                return "".join(characters)
            characters.append(self.parse_escape() if character == "\\" else character)

    def parse_class(self, start: int) -> CodePointRanges:
        negated = self.peek() == "^"
        if negated:
            self.position += 1
        ranges: CodePointRanges = []
        while True:
            if self.position >= len(self.text):
                raise self.error("unterminated character class", start)
            character = self.text[self.position]
            self.position += 1
            if character == "]":
                break
            low = self.parse_escape() if character == "\\" else character
            if self.peek() == "-" and self.text[self.position + 1 : self.position + 2] not in (
                "]",
                "",
            ):
                self.position += 1
                character = self.text[self.position]
                self.position += 1
                high = self.parse_escape() if character == "\\" else character
                if ord(high) < ord(low):
                    raise self.error(f"bad character range {low!r}-{high!r}", start)
                ranges.append((ord(low), ord(high)))
            else:
                ranges.append((ord(low), ord(low)))
        return complement(ranges) if negated else normalize(ranges)
