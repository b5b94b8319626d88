"""A Responses body maps onto the same checked request as Chat Completions: every field is
honoured, neutral, or a 400 naming it. No model needed (test_server_responses sends real
requests to a running server)."""

from __future__ import annotations

from typing import Any

import pytest

from formline.server.errors import ApiError
from formline.server.requests import Limits
from formline.server.responses_requests import parse_responses_request

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
PERSON_FORMAT = {
    "type": "json_schema",
    "name": "person",
    "schema": {"type": "object", "properties": {"name": {"type": "string"}}},
}


def body(**changes: Any) -> dict[str, Any]:
    return {"model": "m", "input": "Hi", **changes}


CASES: list[tuple[str, dict[str, Any], str]] = [
    ("no model", {"model": 5}, "model"),
    ("previous response", {"previous_response_id": "resp_1"}, "previous_response_id"),
    ("conversation", {"conversation": "conv_1"}, "conversation"),
    ("reasoning", {"reasoning": {"effort": "low"}}, "reasoning"),
    ("an unknown field", {"frequency_penalty": 0.5}, "frequency_penalty"),
    ("truncation auto", {"truncation": "auto"}, "truncation"),
    ("background", {"background": True}, "background"),
    ("input empty", {"input": []}, "input"),
    ("input a number", {"input": 5}, "input"),
    ("an item not an object", {"input": ["Hi"]}, "input[0]"),
    ("an unknown role", {"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    (
        "an image part",
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        "input[0].content[0]",
    ),
    ("a reasoning item", {"input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
    (
        "call arguments not JSON",
        {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]},
        "input[0].arguments",
    ),
    (
        "call without a name",
        {"input": [{"type": "function_call", "call_id": "c", "arguments": "{}"}]},
        "input[0].name",
    ),
    (
        "call output a number",
        {"input": [{"type": "function_call_output", "call_id": "c", "output": 5}]},
        "input[0].output",
    ),
    ("instructions a list", {"instructions": ["x"]}, "instructions"),
    ("max_output_tokens over the cap", {"max_output_tokens": 10**6}, "max_output_tokens"),
    ("max_output_tokens zero", {"max_output_tokens": 0}, "max_output_tokens"),
    ("temperature too high", {"temperature": 3}, "temperature"),
    ("text a string", {"text": "json"}, "text"),
    ("text verbosity high", {"text": {"verbosity": "high"}}, "text.verbosity"),
    ("format unknown", {"text": {"format": {"type": "xml"}}}, "text.format.type"),
    ("format without schema", {"text": {"format": {"type": "json_schema"}}}, "text.format.schema"),
    (
        "format with an unknown field",
        {"text": {"format": {**PERSON_FORMAT, "examples": []}}},
        "text.format.examples",
    ),
    (
        "format strict a string",
        {"text": {"format": {**PERSON_FORMAT, "strict": "y"}}},
        "text.format.strict",
    ),
    (
        "json_object with a schema",
        {"text": {"format": {"type": "json_object", "schema": {}}}},
        "text.format.schema",
    ),
    (
        "format schema not an object",
        {"text": {"format": {**PERSON_FORMAT, "schema": 5}}},
        "text.format.schema",
    ),
    ("a hosted tool", {"tools": [{"type": "web_search"}]}, "tools[0].type"),
    (
        "a tool in chat's shape",
        {"tools": [{"type": "function", "function": {}}]},
        "tools[0].function",
    ),
    ("a tool without a name", {"tools": [{"type": "function"}]}, "tools[0].name"),
    ("two tools one name", {"tools": [WEATHER, WEATHER]}, "tools[1].name"),
    ("tool_choice unknown", {"tools": [WEATHER], "tool_choice": "any"}, "tool_choice"),
    (
        "tool_choice names no tool",
        {"tools": [WEATHER], "tool_choice": {"type": "function", "name": "other"}},
        "tool_choice.name",
    ),
    ("tool_choice without tools", {"tool_choice": "required"}, "tool_choice"),
    (
        "tools and a format",
        {"tools": [WEATHER], "tool_choice": "required", "text": {"format": PERSON_FORMAT}},
        "tool_choice",
    ),
    (
        "stream_options without stream",
        {"stream_options": {"include_obfuscation": False}},
        "stream_options",
    ),
    ("metadata not strings", {"metadata": {"a": 1}}, "metadata"),
]


@pytest.mark.parametrize(("label", "changes", "param"), CASES, ids=[case[0] for case in CASES])
def test_a_malformed_or_unsupported_field_is_a_400_naming_it(
    label: str, changes: dict[str, Any], param: str
) -> None:
    with pytest.raises(ApiError) as caught:
        parse_responses_request(body(**changes), Limits())
    assert caught.value.status == 400, label
    assert caught.value.param == param, (label, caught.value.message)


def test_input_items_become_the_chat_messages() -> None:
    items = [
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Paris?"}]},
        {
            "type": "function_call",
            "call_id": "a",
            "name": "get_weather",
            "arguments": '{"city":"Paris"}',
        },
        {"type": "function_call", "call_id": "b", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "a", "output": "sunny"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}]},
    ]
    request = parse_responses_request(body(input=items, instructions="You help."), Limits())
    messages = request.chat.messages
    assert [message["role"] for message in messages] == [
        "system", "system", "user", "assistant", "tool", "assistant",
    ]  # fmt: skip
    assert messages[0]["content"] == "You help." and messages[2]["content"] == "Paris?"
    # Two calls in a row are one assistant turn, written as formline writes calls.
    assert messages[3]["content"] == (
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        '{"name": "get_weather", "arguments": {}}'
    )
    assert messages[4]["content"] == "sunny" and messages[5]["content"] == "Sunny."


def test_the_format_tools_and_budget_map_onto_one_constraint() -> None:
    limits = Limits()
    plain = parse_responses_request(body(), limits)
    assert (
        plain.chat.constraint.kind == "text" and plain.chat.max_tokens == limits.default_max_tokens
    )
    schema = parse_responses_request(
        body(text={"format": PERSON_FORMAT}, max_output_tokens=30), limits
    )
    constraint = schema.chat.constraint
    assert (constraint.kind, constraint.source, constraint.strict) == (
        "json_schema", "text.format.schema", False,
    )  # fmt: skip
    assert constraint.close_objects and schema.chat.max_tokens == 30
    assert schema.echo["text"]["format"]["strict"] is False
    json_object = parse_responses_request(body(text={"format": {"type": "json_object"}}), limits)
    assert json_object.chat.constraint.kind == "json_object"
    named = parse_responses_request(
        body(tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"}), limits
    )
    assert (named.chat.tool_choice, named.chat.named_tool) == ("named", "get_weather")
    # Responses function tools are strict unless they say otherwise (chat's are not).
    assert named.chat.tools[0].strict is True
    assert named.echo["tool_choice"] == {"type": "function", "name": "get_weather"}
    loose = {**WEATHER, "strict": False}
    auto = parse_responses_request(body(tools=[loose], max_tool_calls=100), limits)
    assert auto.chat.tool_choice == "auto" and auto.chat.tools[0].strict is False
    assert auto.chat.max_tool_calls == limits.max_tool_calls  # the server's cap holds


def test_neutral_and_bookkeeping_fields_are_accepted() -> None:
    request = parse_responses_request(
        body(
            truncation="disabled", include=[], background=False, store=True, user="u",
            metadata={"k": "v"}, stream=True, stream_options={"include_obfuscation": False},
            service_tier="auto", prompt_cache_key="p", text={"verbosity": "medium"},
        ),
        Limits(),
    )  # fmt: skip
    assert request.chat.stream and request.echo["metadata"] == {"k": "v"}
