"""A corpus of hostile compile inputs: each must end in a clear error (or a sound compile)
within a bound, never a hang, a crash or a wrong answer.

Each case is what issue 15 tried as a hostile user, plus a few more of the same families.
``expect`` is the exception type and a fragment of its message (the what and the where);
``None`` means the input is legitimate and must compile. The server test sends the schema
cases as ``response_format`` too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


def nested(kind: str, depth: int) -> dict[str, Any]:
    """``depth`` levels of arrays (``items``) or objects (``properties.a``) around an int."""
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(depth):
        if kind == "array":
            schema = {"type": "array", "items": schema}
        else:
            schema = {"type": "object", "properties": {"a": schema}}
    return schema


@dataclass(frozen=True)
class HostileSchema:
    """A schema, and the error it must give (``None``: it must compile)."""

    name: str
    schema: Any
    expect: tuple[str, str] | None
    options: tuple[tuple[str, Any], ...] = ()


ONE_OF = {
    "oneOf": [
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
        {"type": "object", "properties": {"b": {"type": "integer"}}},
    ]
}

SCHEMAS = [
    HostileSchema(
        "maxProperties of 1e9",
        {"type": "object", "maxProperties": 1_000_000_000},
        ("SchemaError", "'maxProperties' at /"),
    ),
    HostileSchema(
        "maxProperties of 1e8",
        {"type": "object", "maxProperties": 100_000_000},
        ("SchemaError", "limit 'repetition'"),
    ),
    HostileSchema(
        "maxItems of 1e9 on objects",
        {"type": "array", "items": {"type": "object"}, "maxItems": 1_000_000_000},
        ("SchemaError", "'maxItems' at /"),
    ),
    HostileSchema(
        "minItems of 1e7", {"type": "array", "minItems": 10_000_000}, ("SchemaError", "minItems")
    ),
    HostileSchema("20 nested arrays", nested("array", 20), None),
    HostileSchema(
        "1000 nested arrays", nested("array", 1000), ("SchemaError", "nested deeper than")
    ),
    HostileSchema(
        "1000 nested objects", nested("object", 1000), ("SchemaError", "nested deeper than")
    ),
    HostileSchema("a minimum of 1e150", {"type": "number", "minimum": 1e150}, None),
    HostileSchema(
        "a tiny exclusive range",
        {"type": "number", "exclusiveMinimum": 0, "maximum": 1e-300},
        None,
    ),
    HostileSchema(
        "an integer bound of 4,400 digits",
        {"type": "integer", "minimum": 10**4400},
        ("SchemaError", "more than 4,000 digits"),
    ),
    HostileSchema(
        "a lone surrogate in a property name",
        {"type": "object", "properties": {"\ud800": {"type": "integer"}}, "required": ["\ud800"]},
        None,
    ),
    HostileSchema("a lone surrogate in an enum", {"enum": ["\ud800", "x\udfffy"]}, None),
    HostileSchema(
        "draft-7 enum beside tuple items",
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "array",
            "items": [{"type": "integer"}],
            "enum": [[1], [2, 3]],
        },
        None,
    ),
    HostileSchema(
        "an enum of 100k values",
        {"enum": [f"value-{index}" for index in range(100_000)]},
        ("SchemaError", "over the limit"),
    ),
    HostileSchema(
        "an unknown $schema",
        {"$schema": "http://example.com/my-draft", "type": "integer"},
        ("SchemaError", "unknown $schema"),
    ),
    HostileSchema(
        "a 3,000-character property name beside open extras",
        {
            "type": "object",
            "properties": {"a" * 3000: {"type": "integer"}},
            "additionalProperties": {"type": "string"},
        },
        # Compiles since the NFA builder shares the rest-of-key grammar between the name's
        # 3,000 trie nodes (it was over the 20,000 DFA-state limit).
        None,
    ),
    HostileSchema(
        "an exponential pattern",
        {"type": "string", "pattern": "^(a|b)*a(a|b){20}$"},
        # Compiles since the automaton is made as decoding reaches its states (2^21 of them:
        # built whole, it was refused at the 20,000 DFA-state limit).
        None,
    ),
    HostileSchema(
        "a pattern of 200 nested groups",
        {"type": "string", "pattern": "(" * 200 + "a" + ")" * 200},
        ("SchemaError", "nested more than"),
    ),
    HostileSchema(
        "a negative max_string_length",
        {"type": "string"},
        ("ValueError", "max_string_length"),
        (("max_string_length", -5),),
    ),
    HostileSchema("the oneOf of issue 15", ONE_OF, None),
    HostileSchema("an integer maximum of 1e300", {"type": "integer", "maximum": 1e300}, None),
    HostileSchema(
        "counts of 1e30",
        {"type": "object", "maxProperties": 10**30, "minProperties": 10**29},
        ("SchemaError", "limit 'repetition'"),
    ),
    HostileSchema(
        "a float maxItems of 1e30", {"type": "array", "maxItems": 1e30}, ("SchemaError", "maxItems")
    ),
    HostileSchema(  # 38,000 rules: looked up by list.index each, 80 s past a 10 s budget
        "500 optional properties under maxProperties 250",
        {
            "type": "object",
            "properties": {f"p{k}": {"type": "integer"} for k in range(500)},
            "maxProperties": 250,
        },
        None,
    ),
    HostileSchema(  # 962,001 member states: 14 s past a 10 s budget, 1 GB, before the limit
        "1,600 optional properties under maxProperties 800",
        {
            "type": "object",
            "properties": {f"p{k}": {"type": "integer"} for k in range(1_600)},
            "maxProperties": 800,
        },
        ("SchemaError", "962,001 member states"),
    ),
]


@dataclass(frozen=True)
class HostileGrammar:
    """A regex or EBNF text, and the error it must give (``None``: it must compile)."""

    name: str
    kind: str  # regex or ebnf
    text: str
    expect: tuple[str, str] | None


GRAMMARS = [
    HostileGrammar(
        "a regex of 200 nested groups",
        "regex",
        "(" * 200 + "a" + ")" * 200,
        ("GrammarError", "nested more than 50"),
    ),
    HostileGrammar(
        "an EBNF of 500 nested parentheses",
        "ebnf",
        "root ::= " + "(" * 500 + '"a"' + ")" * 500,
        ("GrammarError", "nested more than 50"),
    ),
    HostileGrammar("any 1000 characters", "regex", ".{1000}", None),
    HostileGrammar(
        "a million unrolled bytes", "regex", "(a{1000}){1000}", ("GrammarError", "NFA states")
    ),
    # Compiles since the automaton is made lazily (it was refused at the DFA-state limit).
    HostileGrammar("an exponential regex", "regex", "(a|b)*a(a|b){20}", None),
    HostileGrammar(
        "a bound past the repeat limit",
        "regex",
        "a{0,1000000}",
        ("GrammarError", "repetition count above"),
    ),
    HostileGrammar(  # int() refuses 4,300 digits: it was a bare ValueError
        "a 5,000-digit count", "regex", "a{" + "9" * 5000 + "}", ("GrammarError", "above")
    ),
    HostileGrammar(
        "a 5,000-digit count in EBNF",
        "ebnf",
        'root ::= "a"{' + "9" * 5000 + "}",
        ("GrammarError", "repetition count above"),
    ),
    HostileGrammar(  # a JSON request may hold "\ud800": it was a UnicodeEncodeError
        "a lone surrogate", "regex", "a\ud800", ("GrammarError", "U+D800 is a lone surrogate")
    ),
    HostileGrammar(
        "a lone surrogate in EBNF",
        "ebnf",
        'root ::= "\udfff"',
        ("GrammarError", "U+DFFF is a lone surrogate"),
    ),
]


def schema_request_body(schema: Any, model: str) -> bytes:
    """A chat completion request constraining the answer with ``schema``."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    }
    return json.dumps(body).encode()
