"""Malformed chat completion bodies, each with the field its 400 must name (``param``).

Each case is ``(label, changes, param)``: ``changes`` are merged into :data:`BASE`. Shared
by the parse table test and the hostile batch sent to a running server."""

from __future__ import annotations

from typing import Any

BASE: dict[str, Any] = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}

TOOL = {
    "type": "function",
    "function": {"name": "f", "parameters": {"type": "object", "properties": {}}},
}


def tool(**function: Any) -> dict[str, Any]:
    """The function tool ``f`` with ``function``'s fields replaced."""
    return {"type": "function", "function": {**TOOL["function"], **function}}


def assistant_call(**function: Any) -> list[dict[str, Any]]:
    """A chat whose assistant turn made one call whose ``function`` is ``function``."""
    call = {"id": "call_1", "type": "function", "function": function}
    return [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
    ]


def schema_format(**spec: Any) -> dict[str, Any]:
    """A json_schema response_format with ``spec``'s fields replaced."""
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": {}, **spec}}


DEEP = "[" * 300 + "]" * 300
CASES: list[tuple[str, dict[str, Any], str]] = [
    ("model not a string", {"model": 5}, "model"),
    ("messages not a list", {"messages": "Hi"}, "messages"),
    ("messages empty", {"messages": []}, "messages"),
    ("message not an object", {"messages": ["Hi"]}, "messages[0]"),
    ("role a list", {"messages": [{"role": ["user"], "content": "Hi"}]}, "messages[0].role"),
    ("role unknown", {"messages": [{"role": "god", "content": "Hi"}]}, "messages[0].role"),
    ("content a number", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    (
        "content part text not a string",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": {"a": 1}}]}]},
        "messages[0].content[0].text",
    ),
    (
        "content part an image",
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        "messages[0].content[0]",
    ),
    (
        "name a number",
        {"messages": [{"role": "user", "content": "a", "name": 1}]},
        "messages[0].name",
    ),
    (
        "tool_calls a string",
        {"messages": [{"role": "assistant", "content": "a", "tool_calls": "f()"}]},
        "messages[0].tool_calls",
    ),
    (
        "tool_calls on a user message",
        {"messages": [{"role": "user", "content": "a", "tool_calls": [{}]}]},
        "messages[0].tool_calls",
    ),
    (
        "tool_calls[].function a string",
        {
            "messages": assistant_call()[:1]
            + [{"role": "assistant", "tool_calls": [{"function": "f"}]}]
        },
        "messages[1].tool_calls[0].function",
    ),
    (
        "tool_calls[].function.name a list",
        {"messages": assistant_call(name=["f"], arguments="{}")},
        "messages[1].tool_calls[0].function.name",
    ),
    (
        "tool_calls[].function.arguments an object",
        {"messages": assistant_call(name="f", arguments={"a": 1})},
        "messages[1].tool_calls[0].function.arguments",
    ),
    (
        "tool_calls[].function.arguments not JSON",
        {"messages": assistant_call(name="f", arguments="{oops")},
        "messages[1].tool_calls[0].function.arguments",
    ),
    (
        "tool_calls[].function.arguments nested 300 deep",
        {"messages": assistant_call(name="f", arguments=DEEP)},
        "messages[1].tool_calls[0].function.arguments",
    ),
    ("seed negative", {"seed": -1}, "seed"),
    ("seed past int64", {"seed": 2**63}, "seed"),
    ("seed a string", {"seed": "42"}, "seed"),
    ("seed a float", {"seed": 1.5}, "seed"),
    ("n zero", {"n": 0}, "n"),
    ("temperature a string", {"temperature": "hot"}, "temperature"),
    ("temperature too high", {"temperature": 3}, "temperature"),
    ("top_p negative", {"top_p": -0.5}, "top_p"),
    ("max_tokens zero", {"max_tokens": 0}, "max_tokens"),
    ("max_tokens a float", {"max_tokens": 2.5}, "max_tokens"),
    (
        "max_tokens and max_completion_tokens differ",
        {"max_tokens": 2, "max_completion_tokens": 3},
        "max_tokens",
    ),
    ("stream a string", {"stream": "yes"}, "stream"),
    ("stream_options a list", {"stream": True, "stream_options": []}, "stream_options"),
    (
        "stream_options without stream",
        {"stream_options": {"include_usage": True}},
        "stream_options",
    ),
    (
        "include_usage a string",
        {"stream": True, "stream_options": {"include_usage": "yes"}},
        "stream_options.include_usage",
    ),
    ("parallel_tool_calls a string", {"parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ("tools a number", {"tools": 5}, "tools"),
    ("tools an object", {"tools": TOOL}, "tools"),
    ("tool not an object", {"tools": [5]}, "tools[0].type"),
    (
        "tool function a string",
        {"tools": [{"type": "function", "function": "f"}]},
        "tools[0].function",
    ),
    ("tool name empty", {"tools": [tool(name="")]}, "tools[0].function.name"),
    ("tool name a list", {"tools": [tool(name=["f"])]}, "tools[0].function.name"),
    (
        "tool description a number",
        {"tools": [tool(description=5)]},
        "tools[0].function.description",
    ),
    ("tool strict a string", {"tools": [tool(strict="yes")]}, "tools[0].function.strict"),
    ("tool parameters a number", {"tools": [tool(parameters=5)]}, "tools[0].function.parameters"),
    ("tool parameters true", {"tools": [tool(parameters=True)]}, "tools[0].function.parameters"),
    (
        "two tools named alike",
        {"tools": [TOOL, tool(description="again")]},
        "tools[1].function.name",
    ),
    (
        "tool_choice name a list",
        {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": ["f"]}}},
        "tool_choice.function.name",
    ),
    (
        "tool_choice names an unknown tool",
        {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "g"}}},
        "tool_choice.function.name",
    ),
    (
        "tool_choice function a string",
        {"tools": [TOOL], "tool_choice": {"type": "function", "function": "f"}},
        "tool_choice",
    ),
    ("tool_choice a number", {"tools": [TOOL], "tool_choice": 5}, "tool_choice"),
    ("tool_choice a list", {"tools": [TOOL], "tool_choice": ["auto"]}, "tool_choice"),
    ("tool_choice required without tools", {"tool_choice": "required"}, "tool_choice"),
    ("response_format a string", {"response_format": "json"}, "response_format"),
    (
        "response_format type a list",
        {"response_format": {"type": ["text"]}},
        "response_format.type",
    ),
    (
        "response_format text with a schema",
        {"response_format": {"type": "text", "json_schema": {}}},
        "response_format.json_schema",
    ),
    (
        "json_schema a string",
        {"response_format": {"type": "json_schema", "json_schema": "x"}},
        "response_format.json_schema.schema",
    ),
    (
        "json_schema strict a string",
        {"response_format": schema_format(strict="yes")},
        "response_format.json_schema.strict",
    ),
    (
        "json_schema name a number",
        {"response_format": schema_format(name=5)},
        "response_format.json_schema.name",
    ),
    (
        "json_schema schema a number",
        {"response_format": schema_format(schema=5)},
        "response_format.json_schema.schema",
    ),
    (
        "json_schema schema text not JSON",
        {"response_format": schema_format(schema="{oops")},
        "response_format.json_schema.schema",
    ),
    ("structured_outputs a list", {"structured_outputs": []}, "structured_outputs"),
    (
        "structured_outputs regex a number",
        {"structured_outputs": {"regex": 5}},
        "structured_outputs.regex",
    ),
    (
        "structured_outputs choice empty",
        {"structured_outputs": {"choice": []}},
        "structured_outputs.choice",
    ),
    (
        "structured_outputs json_object a number",
        {"structured_outputs": {"json_object": 5}},
        "structured_outputs.json_object",
    ),
    ("guided_choice a string", {"guided_choice": "a"}, "guided_choice"),
    ("guided_choice with a number", {"guided_choice": ["a", 1]}, "guided_choice"),
    ("guided_regex a list", {"guided_regex": ["a"]}, "guided_regex"),
    ("guided_grammar empty", {"guided_grammar": ""}, "guided_grammar"),
    ("guided_json a number", {"guided_json": 5}, "guided_json"),
    ("guided_json text nested 300 deep", {"guided_json": DEEP}, "guided_json"),
]
# Raw bodies that are not JSON as the RFC has it: a 400 with code invalid_json (no param).
RAW_BODIES: list[tuple[str, bytes]] = [
    ("NaN", b'{"model": "m", "messages": [], "temperature": NaN}'),
    ("Infinity", b'{"model": "m", "messages": [], "top_p": -Infinity}'),
    ("a float past the double range", b'{"model": "m", "messages": [], "temperature": 1e400}'),
    ("an integer of 5000 digits", b'{"model": "m", "seed": ' + b"9" * 5000 + b"}"),
    ("nested 5000 deep", b'{"model": "m", "metadata": ' + b"[" * 5000 + b"]" * 5000 + b"}"),
    ("not UTF-8", b'{"model": "\xff\xfe"}'),
]


def body_for(model: str, changes: dict[str, Any]) -> dict[str, Any]:
    """:data:`BASE` for ``model`` with ``changes`` merged in."""
    return {"model": model, **BASE, **changes}


def nested_items(depth: int) -> dict[str, Any]:
    """An array schema ``depth`` levels deep."""
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


# Well-formed bodies whose constraint does not compile: a 400 from the compile, naming it.
# Left out until the lead's compile budgets are merged (today it runs for minutes):
# {"response_format": schema_format(schema={"type": "object", "maxProperties": 10**9})}.
COMPILE_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("regex that does not parse", {"guided_regex": "("}, "guided_regex"),
    ("grammar that does not parse", {"guided_grammar": "root ::= ("}, "guided_grammar"),
    (
        "schema with a dangling $ref",
        {"response_format": schema_format(schema={"$ref": "#/nope"})},
        "response_format.json_schema.schema",
    ),
    (
        "schema nested 80 arrays deep",
        {"response_format": schema_format(schema=nested_items(80))},
        "response_format.json_schema.schema",
    ),
    (
        "tool parameters not a valid schema",
        {"tools": [tool(parameters={"type": "strnig"})], "tool_choice": "required"},
        "tools[0].function.parameters",
    ),
    # Issue 15: each of these held the server for minutes or crashed it before the compile
    # budget; now each is a 400 naming the limit within the compile's budget. Strict: a
    # non-strict schema leaves a count too large to unroll to the after-check (a 200).
    (
        "maxProperties 1e9",
        {
            "response_format": schema_format(
                strict=True, schema={"type": "object", "maxProperties": 10**9}
            )
        },
        "response_format.json_schema.schema",
    ),
    (
        "maxItems 1e9 of objects",
        {
            "response_format": schema_format(
                strict=True,
                schema={"type": "array", "items": {"type": "object"}, "maxItems": 10**9},
            )
        },
        "response_format.json_schema.schema",
    ),
    # An exponential pattern, (a|b)*a(a|b){20}, was one (built whole, its automaton passed
    # the DFA-state limit); made as decoding reaches its states, it compiles in milliseconds.
    ("a regex of a million unrolled bytes", {"guided_regex": "(a{1000}){1000}"}, "guided_regex"),
    (
        "an unknown $schema",
        {
            "response_format": schema_format(
                strict=True, schema={"$schema": "urn:mine", "type": "integer"}
            )
        },
        "response_format.json_schema.schema",
    ),
]
