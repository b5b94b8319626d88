"""``formline serve`` through the official ``openai`` client against a real running server
(uvicorn on a loopback port, the embedded SmolLM2): every constrained answer validates."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest
from pydantic import BaseModel
from server_tools import TIME_TOOL, WEATHER_TOOL, ask, health, tool_call_deltas

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


class Person(BaseModel):
    name: str
    age: int


def test_health_and_models(server: Any, client: Any, model: str) -> None:
    assert health(server.url)["status"] == "ok"
    assert [entry.id for entry in client.models.list().data] == [model]


def test_json_schema_response_format_validates(client: Any, model: str) -> None:
    response = client.chat.completions.create(
        model=model,
        messages=ask("Invent a person."),
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON, "strict": True},
        },
        max_tokens=40,
        temperature=0,  # sampled, the budget's closing policy may end it ("length")
    )
    choice = response.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), PERSON)
    assert response.usage.completion_tokens > 0
    assert response.usage.total_tokens == response.usage.prompt_tokens + 0 + (
        response.usage.completion_tokens
    )


def test_parse_with_a_pydantic_model(client: Any, model: str) -> None:
    response = client.chat.completions.parse(
        model=model,
        messages=ask("Invent a person."),
        response_format=Person,
        max_tokens=40,
        temperature=0,  # sampled, the budget may close it: "length", and parse() raises
    )
    parsed = response.choices[0].message.parsed
    assert isinstance(parsed, Person)


def test_json_object(client: Any, model: str) -> None:
    response = client.chat.completions.create(
        model=model,
        messages=ask("Describe a cat as JSON."),
        response_format={"type": "json_object"},
        max_tokens=60,
        temperature=0,
    )
    choice = response.choices[0]
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.message.content), dict)
    else:
        assert choice.message.content.startswith("{")


@pytest.mark.parametrize(
    ("extra", "check"),
    [
        ({"guided_regex": r"[0-9]{3}-[0-9]{4}"}, lambda text: re.fullmatch(r"\d{3}-\d{4}", text)),
        ({"guided_choice": ["yes", "no"]}, lambda text: text in ("yes", "no")),
        ({"structured_outputs": {"choice": ["red", "blue"]}}, lambda text: text in ("red", "blue")),
        ({"guided_json": PERSON}, lambda text: jsonschema.validate(json.loads(text), PERSON) or 1),
        ({"guided_grammar": 'root ::= "a" [0-9]+ "z"'}, lambda text: re.fullmatch("a\\d+z", text)),
    ],
)
def test_vllm_guided_fields(client: Any, model: str, extra: dict[str, Any], check: Any) -> None:
    response = client.chat.completions.create(
        model=model, messages=ask("Answer."), max_tokens=30, extra_body=extra
    )
    choice = response.choices[0]
    # "length": the budget's closing policy ended it (a name the 135M model loops in), and
    # the text is still whole and matches.
    assert choice.finish_reason in ("stop", "length"), choice
    assert check(choice.message.content), choice.message.content


def test_named_tool_call_arguments_validate(client: Any, model: str) -> None:
    response = client.chat.completions.create(
        model=model,
        messages=ask("What is the weather in Paris?"),
        tools=[WEATHER_TOOL, TIME_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=40,
        temperature=0,
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.id.startswith("call_") and call.function.name == "get_weather"
    schema = WEATHER_TOOL["function"]["parameters"]  # type: ignore[index]
    jsonschema.validate(json.loads(call.function.arguments), schema)


def test_a_cut_off_named_call_is_a_call_streamed_or_not(client: Any, model: str) -> None:
    # Cut off at max_tokens, the call came back as message.content text, while the stream
    # sent the same fragment as the call's arguments (OpenAI keeps it in tool_calls).
    named = {"type": "function", "function": {"name": "get_weather"}}
    request = {
        "model": model,
        "messages": ask("What is the weather in Paris?"),
        "tools": [WEATHER_TOOL],
        "tool_choice": named,
        "max_tokens": 3,
        "temperature": 0,
    }
    choice = client.chat.completions.create(**request).choices[0]
    assert choice.finish_reason == "length" and not choice.message.content
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments.startswith("{")
    deltas, finishes = tool_call_deltas(client.chat.completions.create(**request, stream=True))
    streamed = "".join(delta.function.arguments or "" for delta in deltas)
    assert streamed == call.function.arguments and finishes[-1] == "length"


def test_required_tool_call_picks_one_of_the_tools(client: Any, model: str) -> None:
    response = client.chat.completions.create(
        model=model,
        messages=ask("What time is it in Tokyo?"),
        tools=[WEATHER_TOOL, TIME_TOOL],
        tool_choice="required",
        max_tokens=60,
        temperature=0,
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    tool = {"get_weather": WEATHER_TOOL, "get_time": TIME_TOOL}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])


def test_auto_tool_choice_is_text_or_a_valid_call(client: Any, model: str) -> None:
    response = client.chat.completions.create(
        model=model,
        messages=ask("What is the weather in Paris?"),
        tools=[WEATHER_TOOL],
        max_tokens=40,
        temperature=0,
    )
    choice = response.choices[0]
    if choice.message.tool_calls:
        assert choice.finish_reason == "tool_calls"
        arguments = json.loads(choice.message.tool_calls[0].function.arguments)
        jsonschema.validate(arguments, WEATHER_TOOL["function"]["parameters"])  # type: ignore[index]
    else:
        assert not choice.message.content.startswith("{")


def test_streaming_concatenates_to_valid_json(client: Any, model: str) -> None:
    stream = client.chat.completions.create(
        model=model,
        messages=ask("Invent a person."),
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}},
        max_tokens=40,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, finishes, usage = [], [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finishes.append(choice.finish_reason)
    jsonschema.validate(json.loads("".join(pieces)), PERSON)
    assert finishes[-1] == "stop" and len(pieces) > 2
    assert usage is not None and usage.completion_tokens > 0


def test_n_seed_and_sampling(client: Any, model: str) -> None:
    response = client.chat.completions.create(
        model=model,
        messages=ask("Pick a colour."),
        n=2,
        seed=7,
        temperature=0.9,
        top_p=0.95,
        max_completion_tokens=10,
        extra_body={"guided_choice": ["red", "green", "blue"]},
    )
    assert [choice.index for choice in response.choices] == [0, 1]
    assert all(choice.message.content in ("red", "green", "blue") for choice in response.choices)


def test_max_tokens_cut_off_says_length(client: Any, model: str) -> None:
    response = client.chat.completions.create(
        model=model, messages=ask("Tell a long story."), max_tokens=3
    )
    assert response.choices[0].finish_reason == "length"
    assert response.usage.completion_tokens == 3


STORY = {
    "type": "object",
    "properties": {"story": {"type": "string"}},
    "required": ["story"],
    "additionalProperties": False,
}
STORY_TOOL = {
    "type": "function",
    "function": {"name": "tell", "description": "Tell a story.", "parameters": STORY},
}


def test_json_the_budget_closed_says_length_streamed_or_not(client: Any, model: str) -> None:
    # A long story cannot end in 12 tokens: the closing policy ends the string and the
    # object within the budget. The JSON parses, but the model did not end it: "length",
    # and the named tool's call is the same whether streamed or not.
    asked = ask("Tell a very long story about the sea, with many details.")
    answer = client.chat.completions.create(
        model=model,
        messages=asked,
        response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": STORY}},
        max_tokens=12,
        temperature=0,
    )
    assert answer.choices[0].finish_reason == "length"
    jsonschema.validate(json.loads(answer.choices[0].message.content), STORY)
    named = {"type": "function", "function": {"name": "tell"}}
    options = {"tools": [STORY_TOOL], "tool_choice": named, "max_tokens": 12, "temperature": 0}
    call = client.chat.completions.create(model=model, messages=asked, **options)
    assert call.choices[0].finish_reason == "length"
    arguments = call.choices[0].message.tool_calls[0].function.arguments
    jsonschema.validate(json.loads(arguments), STORY)
    stream = client.chat.completions.create(model=model, messages=asked, stream=True, **options)
    deltas, finishes = tool_call_deltas(stream)
    assert "".join(delta.function.arguments or "" for delta in deltas) == arguments
    assert [finish for finish in finishes if finish] == ["length"]
