"""Defects a review found in the server, each pinned against the real running server on the
embedded SmolLM2 (the official ``openai`` client where it can send the request): a client
gone while its request waited for the model, tool schema errors that pointed into the
server's own wrapper schema, Responses errors that named Chat Completions fields, a
``formline_think`` answer past ``max_tokens``, message keys dropped unread, and the missing
``GET /v1/models/{model}``."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import jsonschema
import openai
import pytest
from server_tools import ask, post_json

from formline.constraint import Plan
from formline.server.app import BackgroundServer, create_app
from formline.server.engine import ChoiceListener, Completion, Engine
from formline.server.requests import ChatRequest

GOOD = {"type": "object", "properties": {"a": {"type": "string"}}}
BAD = {"type": "object", "properties": {"b": {"type": "nope"}}}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 30}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
PEOPLE = {
    "type": "object",
    "properties": {"people": {"type": "array", "items": PERSON}},
    "required": ["people"],
    "additionalProperties": False,
}
WORDS_PAST_THE_CONTEXT = "word " * 9000  # n_ctx is 8,192 tokens


def function(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """A Chat Completions function tool."""
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def refusal(call: Callable[[], Any]) -> dict[str, Any]:
    """The error object of the 4xx that ``call`` (an ``openai`` client call) gets."""
    with pytest.raises(openai.APIStatusError) as caught:
        call()
    body: dict[str, Any] = caught.value.body  # type: ignore[assignment]
    return body


class CountingBackend:
    """The real model, counting its forward passes."""

    def __init__(self, real: Any):
        self.real = real
        self.forwards = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def forward(self, token_ids: list[int]) -> Any:
        self.forwards += 1
        return self.real.forward(token_ids)


class ListenedEngine(Engine):
    """An engine that keeps the choice listeners its requests' loops are given."""

    listeners: list[ChoiceListener]

    def complete(
        self,
        request: ChatRequest,
        plan: Plan | None = None,
        listener_for: Callable[[int, Plan], ChoiceListener] | None = None,
        deadline: float | None = None,
    ) -> Completion:
        assert listener_for is not None  # the app gives every request one

        def kept(index: int, choice_plan: Plan) -> ChoiceListener:
            listener = listener_for(index, choice_plan)
            self.listeners.append(listener)
            return listener

        return super().complete(request, plan, kept, deadline)


@pytest.fixture()
def queued(engine: Engine) -> Iterator[tuple[ListenedEngine, CountingBackend, str]]:
    """A server of its own on the shared model *and lock* (llama.cpp is not thread-safe),
    counting the model's forward passes."""
    backend = CountingBackend(engine.backend)
    listened = ListenedEngine(backend, engine.model_id, engine.limits)  # type: ignore[arg-type]
    listened.lock, listened.listeners = engine.lock, []
    running = BackgroundServer(create_app(listened)).start()
    yield listened, backend, running.url
    running.stop()


def wait_for(condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition`` until it holds (a minute at most: a hung server fails)."""
    waited = 0.0
    while not condition():
        assert waited < 60, f"still waiting for {what}"
        time.sleep(0.05)
        waited += 0.05


def test_a_client_gone_while_queued_never_runs_its_prompt_pass(
    engine: Engine, queued: tuple[ListenedEngine, CountingBackend, str]
) -> None:
    # It took the model and ran its whole prompt pass (seconds on a CPU for a long prompt)
    # before the loop first asked whether its client was still there.
    listened, backend, url = queued
    body = {"model": engine.model_id, "messages": ask("Write a story."), "max_tokens": 50}
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    assert engine.lock.acquire(timeout=60)  # the model busy with a long request
    try:
        connection.request("POST", "/v1/chat/completions", json.dumps(body).encode(),
                           {"Content-Type": "application/json"})  # fmt: skip
        wait_for(lambda: bool(listened.listeners), "the request to reach the model's queue")
        connection.sock.close()  # the client goes away while its request waits
        stops = listened.listeners[0].listener
        wait_for(lambda: stops.on_output([]) == "cancelled", "the server to see it gone")
    finally:
        engine.lock.release()
    wait_for(lambda: listened.stats["cancelled"] == 1, "the request to end")
    assert backend.forwards == 0 and listened.stats["tokens"] == 0


@pytest.mark.parametrize(
    ("tools", "tool_choice", "param"),
    [
        ([function("f", GOOD), function("g", BAD)], "required", "tools[1].function.parameters"),
        ([function("f", GOOD), function("g", BAD)], "auto", "tools[1].function.parameters"),
        ([function("g", BAD)], "auto", "tools[0].function.parameters"),
        ([function("g", BAD)], "required", "tools[0].function.parameters"),
    ],
)
def test_a_tool_schema_error_points_into_the_tools_own_parameters(
    client: Any, model: str, tools: list[dict[str, Any]], tool_choice: str, param: str
) -> None:
    # It pointed into the server's wrapper: /anyOf/1/properties/arguments/properties/b.
    error = refusal(
        lambda: client.chat.completions.create(
            model=model, messages=ask("Hi"), tools=tools, tool_choice=tool_choice, max_tokens=3
        )
    )
    assert error["param"] == param and error["code"] == "invalid_schema"
    assert error["message"].endswith("at JSON pointer /properties/b"), error["message"]


def test_a_responses_tool_schema_error_names_its_flat_field(client: Any, model: str) -> None:
    # It named tools[0].function.parameters, a field Responses tools do not have.
    tool = {"type": "function", "name": "g", "parameters": BAD}
    error = refusal(
        lambda: client.responses.create(
            model=model, input="Hi", tools=[tool], tool_choice="required", max_output_tokens=3
        )
    )
    assert error["param"] == "tools[0].parameters"
    assert error["message"].startswith("tools[0].parameters: ")
    assert error["message"].endswith("at JSON pointer /properties/b")


def test_a_responses_input_past_the_context_names_input(client: Any, model: str) -> None:
    error = refusal(
        lambda: client.responses.create(
            model=model, input=WORDS_PAST_THE_CONTEXT, max_output_tokens=3
        )
    )
    assert (error["param"], error["code"]) == ("input", "context_length_exceeded")


def test_a_choice_list_past_the_context_names_the_constraint(client: Any, model: str) -> None:
    # The messages held one word; the choices' description in the prompt was 22,928 tokens,
    # and the error named messages.
    choices = [f"choice number {index}" for index in range(3000)]
    error = refusal(
        lambda: client.chat.completions.create(
            model=model, messages=ask("Hi"), max_tokens=3, extra_body={"guided_choice": choices}
        )
    )
    assert (error["param"], error["code"]) == ("guided_choice", "context_length_exceeded")
    assert error["message"].startswith("guided_choice: ")


def think(client: Any, model: str, **extra: Any) -> Any:
    """A request whose rationale ends after a few of its 100 tokens, with an answer (two
    people, 46 tokens) far past max_tokens."""
    return client.chat.completions.create(
        model=model, messages=ask("Give JSON for Ann, 3, and Bob, 5."), temperature=0,
        max_tokens=12, extra_body={"formline_think": 100},
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PEOPLE}},
        **extra,
    )  # fmt: skip


def test_a_thinking_answer_stops_at_max_tokens(client: Any, model: str) -> None:
    # The rationale's unused tokens went to the answer: max_tokens 5 gave a 46-token answer
    # with finish_reason "stop". (12 here: after its first token "{", 4 tokens cannot
    # close this schema's answer.)
    response = think(client, model)
    choice, usage = response.choices[0], response.usage
    reasoning = usage.completion_tokens_details.reasoning_tokens
    assert choice.finish_reason == "length" and 0 < reasoning < 100
    assert usage.completion_tokens - reasoning <= 12
    assert choice.message.model_extra["reasoning_content"]
    # Closed within the answer's own budget, as without a rationale: cut at it after the
    # loop, it came back as a fragment ({"people":[{"name":"Ann","age":3).
    jsonschema.validate(json.loads(choice.message.content), PEOPLE)


def test_a_streamed_thinking_answer_stops_at_max_tokens_too(client: Any, model: str) -> None:
    whole = think(client, model).choices[0].message.content
    content, finishes = "", []
    for chunk in think(client, model, stream=True):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            finishes.append(choice.finish_reason)
    assert content == whole and finishes[-1] == "length"


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ({"role": "user", "contnet": "Say hi"}, "messages[0].contnet"),
        ({"role": "system", "content": "Be brief.", "text": "x"}, "messages[0].text"),
        ({"role": "user", "content": "Hi", "tool_call_id": "c"}, "messages[0].tool_call_id"),
        ({"role": "user", "content": "Hi", "refusal": "no"}, "messages[0].refusal"),
    ],
)
def test_a_message_key_nothing_reads_is_refused(
    server: Any, model: str, message: dict[str, Any], param: str
) -> None:
    # {"role": "user", "contnet": ...} was a 200 answering an empty turn.
    body = {"model": model, "messages": [message, *ask("Hi")], "max_tokens": 2}
    status, reply = post_json(f"{server.url}/v1/chat/completions", body)
    assert status == 400, reply
    assert (reply["error"]["param"], reply["error"]["code"]) == (param, "unsupported_parameter")


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user"},
        {"role": "user", "name": "ann", "content": None},
        {"role": "system"},
        {"role": "tool", "tool_call_id": "c"},
        {"role": "assistant"},
    ],
)
def test_a_message_without_content_is_refused(
    server: Any, model: str, message: dict[str, Any]
) -> None:
    body = {"model": model, "messages": [message, *ask("Hi")], "max_tokens": 2}
    status, reply = post_json(f"{server.url}/v1/chat/completions", body)
    assert status == 400, reply
    assert (reply["error"]["param"], reply["error"]["code"]) == (
        "messages[0].content", "missing_required",
    )  # fmt: skip


def test_the_keys_a_message_may_carry_are_still_answered(server: Any, model: str) -> None:
    # The misspelled message is refused; spelled right, with the harmless keys a client
    # sends (a speaker's name, a result's call id, this server's rationale echoed back,
    # a null), it is answered.
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    # OpenAI's own fields of an earlier answer, as the openai client sends it back
    # (annotations: [], a refusal, audio), passed too: the whitelist refused them at first.
    messages = [
        {"role": "user", "content": "Hi", "name": "ann", "refusal": None, "tool_calls": []},
        {"role": "assistant", "tool_calls": [call], "reasoning_content": "A call."},
        {"role": "tool", "tool_call_id": "c", "content": "ok"},
        {"role": "assistant", "content": "Done.", "annotations": [], "audio": None},
        {"role": "user", "content": "And?"},
        {"role": "assistant", "content": None, "refusal": "I cannot help with that."},
        {"role": "user", "content": "Fine."},
    ]
    url = f"{server.url}/v1/chat/completions"
    misspelled = [{"role": "user", "contnet": "Hi"}, *messages[1:]]
    assert post_json(url, {"model": model, "messages": misspelled, "max_tokens": 2})[0] == 400
    status, reply = post_json(url, {"model": model, "messages": messages, "max_tokens": 2})
    assert status == 200, reply


@pytest.mark.parametrize(
    ("item", "param"),
    [
        ({"role": "user", "text": "hi"}, "input[0].text"),
        ({"type": "message", "role": "user"}, "input[0].content"),
        ({"role": "tool", "content": "ok"}, "input[0].role"),
        ({"type": "function_call_output", "call_id": "c"}, "input[0].output"),
        ({"type": "function_call_output", "call_id": "c", "result": "ok"}, "input[0].result"),
        ({"type": "function_call", "name": "f", "arguments": "{}", "args": 1}, "input[0].args"),
    ],
)
def test_a_responses_input_item_nothing_reads_is_refused(
    server: Any, model: str, item: dict[str, Any], param: str
) -> None:
    body = {"model": model, "input": [item, {"role": "user", "content": "Hi"}]}
    status, reply = post_json(f"{server.url}/v1/responses", {**body, "max_output_tokens": 2})
    assert status == 400 and reply["error"]["param"] == param, reply


def test_one_model_is_retrieved_like_its_list_entry(client: Any, model: str) -> None:
    # GET /v1/models/{model} was a plain 404.
    assert client.models.retrieve(model) == client.models.list().data[0]
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("gpt-4o")
    assert caught.value.body["code"] == "model_not_found"  # type: ignore[index]
