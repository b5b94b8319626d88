"""``formline_think``: a free rationale before the JSON answer, through the real server and
the official client, on the embedded model (greedy, so the streamed and the whole answer
are the same decoding)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from openai import BadRequestError
from server_tools import ask

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 30}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
QUESTION = ask("Mateus Carvalho, 34, lives in Porto. Extract the person.")


def create(client: Any, model: str, **extra: Any) -> Any:
    return client.chat.completions.create(
        model=model, messages=QUESTION, response_format=FORMAT, temperature=0, max_tokens=60,
        extra_body={"formline_think": 24}, **extra,
    )  # fmt: skip


def test_the_rationale_comes_apart_from_the_answer(client: Any, model: str) -> None:
    choice = create(client, model).choices[0]
    assert choice.finish_reason == "stop"
    value = json.loads(choice.message.content)  # the content is the JSON alone
    jsonschema.validate(value, PERSON)
    reasoning = choice.message.model_extra["reasoning_content"]
    assert reasoning and "{" not in reasoning


def test_a_stream_sends_the_rationale_as_reasoning_deltas(client: Any, model: str) -> None:
    whole = create(client, model).choices[0].message
    reasoning, content = "", ""
    for chunk in create(client, model, stream=True):
        for choice in chunk.choices:
            extra = choice.delta.model_extra or {}
            reasoning += extra.get("reasoning_content") or ""
            content += choice.delta.content or ""
    assert reasoning == whole.model_extra["reasoning_content"]
    assert content == whole.content


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"formline_think": 10}, "needs a JSON answer"),  # a text answer
        ({"formline_think": -1}, "between 0 and 256"),
        ({"formline_think": 10_000}, "between 0 and 256"),
        ({"formline_think": "a lot"}, "must be an integer"),
    ],
)
def test_bad_thinking_is_a_400_naming_it(
    client: Any, model: str, body: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(BadRequestError) as raised:
        client.chat.completions.create(model=model, messages=QUESTION, extra_body=body)
    assert raised.value.body["param"] == "formline_think"  # type: ignore[index]
    assert fragment in raised.value.body["message"]  # type: ignore[index]


@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_without_a_fixed_first_byte_cannot_think(
    client: Any, model: str, stream: bool
) -> None:
    either = {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": ["integer", "string"]}},
    }
    with pytest.raises(BadRequestError) as raised:
        client.chat.completions.create(
            model=model, messages=QUESTION, response_format=either, stream=stream,
            extra_body={"formline_think": 8},
        )  # fmt: skip
    assert raised.value.body["param"] == "formline_think"  # type: ignore[index]
    assert "starts with one fixed byte" in raised.value.body["message"]  # type: ignore[index]
