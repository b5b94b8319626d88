"""Several tool calls in one answer (``parallel_tool_calls``, OpenAI's default).

The grammar side runs on the real compiled plan. The 135M model never writes a second call
(0 of 8 sampled answers, with a two-call example in the prompt), so the server side replays
a fixed answer as scripted logits (:class:`ScriptedEngine`) through the real tokenizer, the
real decoding loop, the request's real matcher (a refused token changes the answer, and
the test fails) and the real server, read by the ``openai`` client.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from server_tools import TIME_TOOL, WEATHER_TOOL, ask, tool_call_deltas

from formline.mask.matcher import GrammarMatcher
from formline.server.app import BackgroundServer, create_app
from formline.server.constraints import plan_output
from formline.server.engine import Engine
from formline.server.requests import Limits, parse_chat_request
from scripted import ScriptedEngine

TWO_CALLS = (
    '[{"name":"get_weather","arguments":{"city":"Paris","unit":"celsius"}},'
    '{"name":"get_time","arguments":{"timezone":"Asia/Tokyo"}}]'
)


def call(name: str, arguments: dict[str, Any]) -> str:
    return json.dumps({"name": name, "arguments": arguments}, separators=(",", ":"))


def plan_for(body: dict[str, Any], llama_backend: Any) -> Any:
    base = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    request = parse_chat_request(base | body, Limits(max_tool_calls=3))
    return plan_output(request, llama_backend.vocabulary)


def is_accepted(plan: Any, text: str) -> bool:
    matcher = GrammarMatcher(plan.compiled)
    return matcher.accept_string(text) and matcher.can_end()


@pytest.mark.parametrize("choice", ["required", "auto"])
def test_the_grammar_takes_one_to_max_calls_as_an_array(choice: str, llama_backend: Any) -> None:
    plan = plan_for({"tools": [WEATHER_TOOL, TIME_TOOL], "tool_choice": choice}, llama_backend)
    one = call("get_weather", {"city": "Oslo", "unit": "celsius"})
    assert is_accepted(plan, f"[{one}]")
    assert is_accepted(plan, TWO_CALLS)
    assert is_accepted(plan, f"[{one},{one},{one}]")
    assert not is_accepted(plan, f"[{one},{one},{one},{one}]")  # max_tool_calls is 3
    assert not is_accepted(plan, "[]")
    assert not is_accepted(plan, one)  # with parallel calls the answer is always an array
    assert "JSON array" in plan.description


def test_parallel_tool_calls_false_allows_exactly_one_call(llama_backend: Any) -> None:
    body = {
        "tools": [WEATHER_TOOL, TIME_TOOL],
        "tool_choice": "required",
        "parallel_tool_calls": False,
    }
    plan = plan_for(body, llama_backend)
    assert is_accepted(plan, call("get_time", {"timezone": "UTC"}))
    assert not is_accepted(plan, TWO_CALLS)


@pytest.fixture(scope="module")
def replay_server(llama_backend: Any) -> Iterator[BackgroundServer]:
    answers = [TWO_CALLS] * 8  # one per request of this module
    engine = Engine(ScriptedEngine(llama_backend, *answers), "replay", Limits())
    running = BackgroundServer(create_app(engine)).start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def replay_client(replay_server: BackgroundServer) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=f"{replay_server.url}/v1", api_key="x", max_retries=0, timeout=60)


def test_several_calls_come_back_as_several_tool_calls(replay_client: Any) -> None:
    response = replay_client.chat.completions.create(
        model="replay",
        messages=ask("Weather in Paris and the time in Tokyo?"),
        tools=[WEATHER_TOOL, TIME_TOOL],
        tool_choice="required",
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls
    assert [c.function.name for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris", "unit": "celsius"}
    assert json.loads(calls[1].function.arguments) == {"timezone": "Asia/Tokyo"}
    assert len({c.id for c in calls}) == 2 and all(c.id.startswith("call_") for c in calls)


def test_several_calls_stream_as_indexed_tool_call_deltas(replay_client: Any) -> None:
    stream = replay_client.chat.completions.create(
        model="replay",
        messages=ask("Weather in Paris and the time in Tokyo?"),
        tools=[WEATHER_TOOL, TIME_TOOL],
        stream=True,
    )
    deltas, finishes = tool_call_deltas(stream)
    assert [(d.index, d.function.name) for d in deltas] == [(0, "get_weather"), (1, "get_time")]
    assert json.loads(deltas[1].function.arguments) == {"timezone": "Asia/Tokyo"}
    assert finishes[-1] == "tool_calls"
