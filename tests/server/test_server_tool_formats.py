"""Tool calls in the model's own syntax (``hermes``, ``smollm2``, ``llama3``) and the fallback.

The grammar side runs on the real compiled plans and the embedded model's real tokenizer.
The real model writes a ``required`` call in the hermes format through the real server; a
call *after free text* is something the 135M model never writes (0 of 8 prompts, in every
format), so that answer is replayed as scripted logits (:class:`ScriptedEngine`) through
the real tokenizer, decoding loop, matcher and server, read by the ``openai`` client.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from server_tools import TIME_TOOL, WEATHER_TOOL, ask, engine_with, tool_call_deltas

from formline.grammar import ir
from formline.grammar.ir import unflatten
from formline.mask.matcher import GrammarMatcher
from formline.server.app import BackgroundServer, create_app
from formline.server.cli import build_engine
from formline.server.constraints import plan_output
from formline.server.engine import Engine
from formline.server.requests import Limits, parse_chat_request
from formline.server.tool_formats import FORMATS, detect_tool_format, read_tagged
from scripted import ScriptedEngine

QWEN_LIKE = "{%- if tools %}...<tools>...</tools>...<tool_call>\\n{...}\\n</tool_call>{%- endif %}"
LLAMA_LIKE = "{%- if builtin_tools %}<|python_tag|>{%- endif %}ipython"
WEATHER_CALL = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
TEXT_THEN_CALL = f"Let me look that up.\n<tool_call>\n{WEATHER_CALL}\n</tool_call>"


def plan_for(body: dict[str, Any], vocabulary: Any, form: str) -> Any:
    base = {"model": "m", "messages": ask("x"), "tools": [WEATHER_TOOL, TIME_TOOL]}
    request = parse_chat_request(base | body, Limits(max_tool_calls=2))
    return plan_output(request, vocabulary, tool_format=FORMATS[form])


def is_accepted(plan: Any, text: str) -> bool:
    matcher = GrammarMatcher(plan.compiled)
    return matcher.accept_string(text) and matcher.can_end()


def test_the_format_comes_from_the_chat_template(llama_backend: Any) -> None:
    assert detect_tool_format(QWEN_LIKE).name == "hermes"
    assert detect_tool_format(LLAMA_LIKE).name == "llama3"
    assert detect_tool_format(None).name == "json"
    # The embedded SmolLM2-135M's template has no tool syntax: the JSON fallback.
    assert llama_backend.chat_template and "tool" not in llama_backend.chat_template
    assert detect_tool_format(llama_backend.chat_template).name == "json"


def test_hermes_auto_is_free_text_then_optional_tagged_calls(llama_backend: Any) -> None:
    plan = plan_for({"tool_choice": "auto"}, llama_backend.vocabulary, "hermes")
    assert plan.mode == "tool_tagged" and "<tool_call>" in plan.description
    assert is_accepted(plan, "It is sunny, I think. <b>bold</b> and <tool_ca is fine")
    assert is_accepted(plan, TEXT_THEN_CALL)
    time_call = '{"name":"get_time","arguments":{"timezone":"UTC"}}'
    assert is_accepted(plan, f"{TEXT_THEN_CALL}\n<tool_call>\n{time_call}\n</tool_call>")
    assert not is_accepted(plan, '<tool_call>\n{"name": "get_news"}\n</tool_call>')
    assert not is_accepted(plan, f"{TEXT_THEN_CALL} and text after")
    three = "\n".join([f"<tool_call>\n{WEATHER_CALL}\n</tool_call>"] * 3)
    assert not is_accepted(plan, three)  # max_tool_calls is 2


def test_hermes_required_starts_with_the_tag(llama_backend: Any) -> None:
    plan = plan_for({"tool_choice": "required"}, llama_backend.vocabulary, "hermes")
    assert is_accepted(plan, f"<tool_call>\n{WEATHER_CALL}\n</tool_call>")
    assert not is_accepted(plan, TEXT_THEN_CALL)
    assert not is_accepted(plan, "plain text")


def test_a_repeated_tool_request_reuses_its_composed_grammar(
    llama_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rebuilt: list[int] = []

    def counted(flat: Any) -> Any:
        rebuilt.append(len(flat.kind))
        return unflatten(flat)

    monkeypatch.setattr(ir, "unflatten", counted)
    body = {"tool_choice": "auto"}
    first = plan_for(body, llama_backend.vocabulary, "hermes")
    rebuilt.clear()
    again = plan_for(body, llama_backend.vocabulary, "hermes")
    assert again.compiled is first.compiled
    assert rebuilt == []  # the call schema's grammar stays compact: no node rebuilt
    required = plan_for(body | {"tool_choice": "required"}, llama_backend.vocabulary, "hermes")
    assert required.compiled is not first.compiled  # the form is part of the cache's key
    assert is_accepted(again, TEXT_THEN_CALL) and not is_accepted(required, TEXT_THEN_CALL)


def test_smollm2_holds_every_call_in_one_tag(llama_backend: Any) -> None:
    plan = plan_for({"tool_choice": "auto"}, llama_backend.vocabulary, "smollm2")
    assert is_accepted(plan, f"<tool_call>[{WEATHER_CALL}]</tool_call>")
    assert is_accepted(plan, "no call needed")
    assert not is_accepted(plan, f"<tool_call>{WEATHER_CALL}</tool_call>")  # a list, always


def test_llama3_writes_parameters_as_the_whole_answer(llama_backend: Any) -> None:
    plan = plan_for({"tool_choice": "auto"}, llama_backend.vocabulary, "llama3")
    assert plan.mode == "tool_auto" and '"parameters"' in plan.description
    assert is_accepted(plan, '{"name": "get_time", "parameters": {"timezone": "UTC"}}')
    assert not is_accepted(plan, '{"name": "get_time", "arguments": {"timezone": "UTC"}}')
    assert is_accepted(plan, "Hello there.")


def test_reading_tags_splits_text_from_calls() -> None:
    content, bodies = read_tagged(FORMATS["hermes"], TEXT_THEN_CALL)
    assert content == "Let me look that up.\n" and bodies == [json.loads(WEATHER_CALL)]
    assert read_tagged(FORMATS["hermes"], "no call") == ("no call", None)
    content, bodies = read_tagged(FORMATS["smollm2"], f"<tool_call>[{WEATHER_CALL}]</tool_call>")
    assert content == "" and bodies == [[json.loads(WEATHER_CALL)]]
    with pytest.raises(ValueError):
        read_tagged(FORMATS["hermes"], "<tool_call>\n{oops\n</tool_call>")


def test_build_engine_detects_the_embedded_model_format() -> None:
    engine = build_engine(threads=1)
    assert engine.tool_format.name == "json"
    assert build_engine(threads=1, tool_format="hermes").tool_format.name == "hermes"


@pytest.fixture(scope="module")
def hermes_client(engine: Engine) -> Iterator[Any]:
    from openai import OpenAI

    hermes = engine_with(engine)
    hermes.tool_format = FORMATS["hermes"]
    running = BackgroundServer(create_app(hermes)).start()
    yield OpenAI(base_url=f"{running.url}/v1", api_key="x", max_retries=0, timeout=120)
    running.stop()


def test_the_real_model_calls_a_required_tool_in_hermes_tags(
    hermes_client: Any, model: str
) -> None:
    response = hermes_client.chat.completions.create(
        model=model, messages=ask("What's the weather in Paris?"), tools=[WEATHER_TOOL],
        tool_choice="required", temperature=0, max_tokens=400,
    )  # fmt: skip
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls
    assert calls and len({call.id for call in calls}) == len(calls)
    parameters = WEATHER_TOOL["function"]["parameters"]  # type: ignore[index]
    for call in calls:  # one tag per call; the 135M model writes one or two
        assert call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), parameters)


@pytest.fixture(scope="module")
def replay_client(llama_backend: Any) -> Iterator[Any]:
    from openai import OpenAI

    engine = Engine(ScriptedEngine(llama_backend, *[TEXT_THEN_CALL] * 4), "replay", Limits())
    engine.tool_format = FORMATS["hermes"]
    running = BackgroundServer(create_app(engine)).start()
    yield OpenAI(base_url=f"{running.url}/v1", api_key="x", max_retries=0, timeout=60)
    running.stop()


def test_text_before_a_call_is_the_content(replay_client: Any) -> None:
    response = replay_client.chat.completions.create(
        model="replay", messages=ask("Weather in Paris?"), tools=[WEATHER_TOOL, TIME_TOOL]
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me look that up.\n"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "celsius"}


def test_a_stream_sends_the_text_and_never_the_tag_as_content(replay_client: Any) -> None:
    stream = replay_client.chat.completions.create(
        model="replay", messages=ask("Weather?"), tools=[WEATHER_TOOL, TIME_TOOL], stream=True
    )
    chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == "Let me look that up.\n"
    deltas, finishes = tool_call_deltas(iter(chunks))
    assert [d.function.name for d in deltas] == ["get_weather"]
    assert finishes[-1] == "tool_calls"


def test_the_responses_api_gives_a_message_then_a_call(replay_client: Any) -> None:
    tool = {"type": "function", **WEATHER_TOOL["function"]}  # type: ignore[dict-item]
    response = replay_client.responses.create(model="replay", input="Weather?", tools=[tool])
    assert [item.type for item in response.output] == ["message", "function_call"]
    assert response.output_text == "Let me look that up.\n"
    with replay_client.responses.stream(model="replay", input="Weather?", tools=[tool]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert [item.type for item in final.output] == ["message", "function_call"]
    assert kinds.index("response.output_text.done") < kinds.index(
        "response.function_call_arguments.done"
    )
