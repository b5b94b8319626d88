"""Shared helpers for the mask tests: a small synthetic vocabulary and a greedy tokenizer."""

from __future__ import annotations

from formline.grammar.ir import ByteSet, Choice, Literal, Node, Repeat, RuleReference, Sequence
from formline.vocab import Vocabulary

MERGES = [
    '{"',
    '":',
    '": ',
    '", "',
    '",',
    '"}',
    '"]',
    "},{",
    "[[",
    "]]",
    "[{",
    "}]",
    "ab",
    "abc",
    "ba",
    "12",
    "123",
    "0.",
    "-1",
    "é",
    "中",
    "中文",
    "ing",
    " the",
    "true",
    "null",
    "false",
    ", ",
    "a)",
    "((",
    "))",
    "(a",
    "+1",
    "1+",
    "x",
    "xy",
    "\\n",
    '\\"',
    "aa",
    "aaa",
    "bb",
]

# JSON as llama.cpp's GBNF: objects, arrays, escapes and numbers, recursion through value.
JSON_GBNF = r"""
root ::= value
value ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ( string ":" value ( "," string ":" value )* )? "}"
array ::= "[" ( value ( "," value )* )? "]"
string ::= "\"" ( [^"\\\x00-\x1f] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\""
number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
"""


def synthetic_vocabulary() -> Vocabulary:
    """EOS at 0, a special token at 1, all 256 single bytes, then multi-byte merges."""
    tokens: list[bytes] = [b"<eos>", b"<pad>"] + [bytes((value,)) for value in range(256)]
    tokens += [merge.encode("utf-8") for merge in MERGES]
    return Vocabulary.from_list(tokens, eos_ids=[0], special_ids=[1], vocab_size=len(tokens) + 5)


def greedy_tokenize(vocabulary: Vocabulary, data: bytes) -> list[int]:
    """Longest-match tokenization (every single byte is a token, so it always succeeds)."""
    lookup = {
        token: token_id
        for token_id, token in enumerate(vocabulary.token_bytes)
        if token and token_id not in vocabulary.special_ids
    }
    longest = max(len(token) for token in lookup)
    ids, position = [], 0
    while position < len(data):
        for size in range(min(longest, len(data) - position), 0, -1):
            piece = data[position : position + size]
            if piece in lookup:
                ids.append(lookup[piece])
                position += size
                break
    return ids


def sample_string(rules: dict[str, Node], node: Node, draw, depth: int = 0) -> bytes:
    """A random string of the node's language; ``draw(n)`` picks an int in [0, n)."""
    if isinstance(node, Literal):
        return node.value
    if isinstance(node, ByteSet):
        low, high = node.ranges[draw(len(node.ranges))]
        return bytes((low + draw(high - low + 1),))
    if isinstance(node, Sequence):
        return b"".join(sample_string(rules, item, draw, depth) for item in node.items)
    if isinstance(node, Choice):
        options = node.options
        if depth > 6:  # the first option terminates (a convention of the test grammars) when deep
            return sample_string(rules, options[0], draw, depth + 1)
        return sample_string(rules, options[draw(len(options))], draw, depth + 1)
    if isinstance(node, Repeat):
        upper = node.maximum if node.maximum is not None else node.minimum + 3
        if depth > 6:
            upper = node.minimum
        count = node.minimum + draw(upper - node.minimum + 1)
        return b"".join(sample_string(rules, node.item, draw, depth + 1) for _ in range(count))
    if isinstance(node, RuleReference):
        return sample_string(rules, rules[node.name], draw, depth + 1)
    raise AssertionError(node)
