"""``POST /v1/responses`` through the official ``openai`` client (``responses.create``,
``responses.parse``, ``responses.stream``) against the real running server and the
embedded SmolLM2: the same constraint and decoding loop as Chat Completions."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from openai import BadRequestError
from pydantic import BaseModel
from server_tools import post_json

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
BOTH_BRANCHES = {"oneOf": [{"const": "same"}, {"const": "same"}]}


class Person(BaseModel):
    name: str
    age: int


def test_text_answer_with_usage(client: Any, model: str) -> None:
    response = client.responses.create(
        model=model, input="Say hello.", instructions="Answer briefly.", max_output_tokens=12
    )
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status in ("completed", "incomplete") and response.output_text
    assert response.instructions == "Answer briefly." and response.store is False
    usage = response.usage
    assert (
        usage.output_tokens > 0 and usage.total_tokens == usage.input_tokens + usage.output_tokens
    )


def test_json_schema_format_validates(client: Any, model: str) -> None:
    response = client.responses.create(
        model=model,
        input="Invent a person.",
        text={
            "format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
        },
        max_output_tokens=40,
        temperature=0,
    )
    assert response.status == "completed"
    message = response.output[0]
    assert message.type == "message" and message.content[0].type == "output_text"
    jsonschema.validate(json.loads(response.output_text), PERSON)
    assert response.text.format.name == "person"


def test_parse_with_a_pydantic_model(client: Any, model: str) -> None:
    response = client.responses.parse(
        model=model,
        input="Invent a person.",
        text_format=Person,
        max_output_tokens=40,
        temperature=0,
    )
    assert isinstance(response.output_parsed, Person)


def test_json_object_format(client: Any, model: str) -> None:
    response = client.responses.create(
        model=model,
        input="Describe a cat in JSON.",
        text={"format": {"type": "json_object"}},
        max_output_tokens=40,
    )
    if response.status == "completed":
        assert isinstance(json.loads(response.output_text), dict)
    else:  # cut off: the budget, said as such, and still a JSON prefix
        assert response.incomplete_details.reason == "max_output_tokens"
        assert response.output_text.startswith("{")


def test_a_required_tool_call_and_its_output_round_trip(client: Any, model: str) -> None:
    question = "What is the weather in Paris?"
    response = client.responses.create(
        model=model, input=question, tools=[WEATHER], tool_choice="required",
        max_output_tokens=60, temperature=0,  # sampled, the budget may close it: incomplete
    )  # fmt: skip
    assert response.status == "completed"
    calls = [item for item in response.output if item.type == "function_call"]
    assert calls and all(call.name == "get_weather" for call in calls)
    for call in calls:
        assert call.call_id.startswith("call_") and call.id.startswith("fc_")
        jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    call = calls[0]
    followed = client.responses.create(
        model=model,
        input=[
            {"role": "user", "content": question},
            {"type": "function_call", "call_id": call.call_id, "name": call.name,
             "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"},
        ],
        tools=[WEATHER],
        tool_choice="none",
        max_output_tokens=20,
    )  # fmt: skip
    assert followed.output[0].type == "message" and followed.output_text


def test_streamed_events_rebuild_the_final_response(client: Any, model: str) -> None:
    with client.responses.stream(
        model=model,
        input="Invent a person.",
        text_format=Person,
        max_output_tokens=40,
        temperature=0,
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [event.type for event in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-1] == "response.completed" and "response.output_text.done" in kinds
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == final.output_text
    assert isinstance(final.output_parsed, Person)
    assert final.id == events[0].response.id and final.status == "completed"


def test_a_named_tool_streams_its_arguments(client: Any, model: str) -> None:
    with client.responses.stream(
        model=model, input="Weather in Oslo?", tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=40,
        temperature=0,
    ) as stream:  # fmt: skip
        events = list(stream)
        final = stream.get_final_response()
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    call = final.output[0]
    assert call.type == "function_call" and call.name == "get_weather"
    assert len(deltas) > 1 and "".join(deltas) == call.arguments
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])


def test_a_cut_off_answer_is_incomplete_streamed_or_not(client: Any, model: str) -> None:
    # Greedy: sampled at the default temperature of 1, the answer once ended in 4 tokens
    # (the stream closed "completed", rightly).
    response = client.responses.create(
        model=model, input="Count to fifty.", max_output_tokens=4, temperature=0
    )
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].status == "incomplete" and response.usage.output_tokens == 4
    stream = client.responses.create(
        model=model, input="Count to fifty.", max_output_tokens=4, temperature=0, stream=True
    )
    assert [event.type for event in stream][-1] == "response.incomplete"


def test_an_answer_the_schema_refuses_is_failed_not_completed(
    server: Any, client: Any, model: str
) -> None:
    text = {"format": {"type": "json_schema", "name": "s", "schema": BOTH_BRANCHES}}
    body = {"model": model, "input": "Say it.", "max_output_tokens": 8, "text": text}
    status, reply = post_json(f"{server.url}/v1/responses", body)
    assert status == 200 and reply["status"] == "failed", reply
    assert reply["output"][0]["content"][0]["text"] == '"same"'  # nothing is lost
    assert reply["error"]["code"] == "invalid_output"
    assert any("valid under each of" in error for error in reply["formline_errors"])
    stream = client.responses.create(model=model, input="Say it.", max_output_tokens=8,
                                     text=text, stream=True)  # fmt: skip
    last = list(stream)[-1]
    assert last.type == "response.failed" and last.response.error.code == "invalid_output"


@pytest.mark.parametrize(
    ("changes", "param"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
         "input[0].content[0]"),
        ({"text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "nope"}}}},
         "text.format.schema"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ],
)  # fmt: skip
def test_an_unsupported_or_bad_field_is_a_400_naming_it(
    client: Any, model: str, changes: dict[str, Any], param: str
) -> None:
    request = {"model": model, "input": "Hi", "max_output_tokens": 4, **changes}
    with pytest.raises(BadRequestError) as caught:
        client.responses.create(**request)
    assert caught.value.body["param"] == param
