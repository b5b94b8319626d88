"""Streaming per token, a client that goes away, and the per-request time limit, against a
real running server on the embedded SmolLM2 (the official ``openai`` client)."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import jsonschema
import openai
import pytest
from server_tools import WEATHER_TOOL, ask, health, tool_call_deltas

from formline.server.app import BackgroundServer
from formline.server.constraints import plan_output
from formline.server.engine import ChoiceOutput, Engine
from formline.server.requests import Limits, parse_chat_request
from formline.server.streaming import ChoiceStream, ChunkWriter

WORDS = "[a-z ]{120}"  # long enough that decoding outlasts the first chunks (~40 tokens)
LONG_WORDS = "[a-z ]{350}"  # ~120 tokens: about 1 s of decoding, cut short by the tests
# ~380 tokens, for the 0.5 s limit's tests: in one full test run the streamed answer to
# LONG_WORDS (its compile cached by the test before) ended without meeting the limit.
PAST_THE_LIMIT_WORDS = "[a-z ]{1100}"


def stream_words(client: Any, model: str, pattern: str, max_tokens: int) -> Any:
    """A streamed answer constrained to ``pattern``."""
    return client.chat.completions.create(
        model=model,
        messages=ask("Write some words."),
        max_tokens=max_tokens,
        stream=True,
        extra_body={"guided_regex": pattern},
    )


def wait_until_idle(server: BackgroundServer, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while health(server.url)["busy"]:
        assert time.monotonic() < deadline, "the model stayed busy"
        time.sleep(0.02)


@pytest.fixture
def short_limit(engine: Engine) -> Iterator[Engine]:
    """The shared engine with a 0.5 s per-request limit, restored afterwards."""
    saved = engine.limits
    engine.limits = replace(saved, request_seconds=0.5)
    yield engine
    engine.limits = saved


def test_tokens_stream_while_the_model_is_still_decoding(
    client: Any, model: str, server: BackgroundServer
) -> None:
    wait_until_idle(server)
    stream = stream_words(client, model, WORDS, 80)
    pieces: list[str] = []
    busy_at_first_piece = None
    for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.content:
                if busy_at_first_piece is None:  # generate-then-stream would be idle here
                    busy_at_first_piece = health(server.url)["busy"]
                pieces.append(choice.delta.content)
    assert busy_at_first_piece is True
    assert re.fullmatch(WORDS, "".join(pieces))
    assert len(pieces) >= 10  # one event per decoding step, not one per answer


def test_a_client_that_goes_away_stops_the_decoding_loop(
    client: Any, model: str, server: BackgroundServer, engine: Engine
) -> None:
    wait_until_idle(server)
    before = dict(engine.stats)
    stream = stream_words(client, model, LONG_WORDS, 400)
    events = iter(stream)
    for _ in range(3):
        next(events)
    stream.close()
    wait_until_idle(server)
    assert engine.stats["cancelled"] == before["cancelled"] + 1
    assert engine.stats["tokens"] - before["tokens"] < 300  # stopped well before its end


def test_a_decode_past_the_time_limit_is_stopped_with_a_504(
    client: Any, model: str, server: BackgroundServer, short_limit: Engine
) -> None:
    wait_until_idle(server)
    before = short_limit.stats["timeout"]
    body = {
        "model": model,
        "messages": ask("Write some words."),
        "max_tokens": 400,
        "guided_regex": PAST_THE_LIMIT_WORDS,
    }
    request = urllib.request.Request(
        f"{server.url}/v1/chat/completions", json.dumps(body).encode(), method="POST"
    )
    request.add_header("Content-Type", "application/json")
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=60)
    error = json.load(caught.value)["error"]
    assert caught.value.code == 504 and error["code"] == "timeout"
    assert "0.5 s" in error["message"] and "--request-seconds" in error["message"]
    assert caught.value.headers["x-should-retry"] == "false"  # the openai client obeys it
    assert short_limit.stats["timeout"] == before + 1
    assert not health(server.url)["busy"]  # the lock was freed with the loop


def test_a_streamed_decode_past_the_time_limit_ends_with_an_error_event(
    client: Any, model: str, server: BackgroundServer, short_limit: Engine
) -> None:
    wait_until_idle(server)
    before = short_limit.stats["timeout"]
    stream = stream_words(client, model, PAST_THE_LIMIT_WORDS, 400)
    pieces: list[str] = []
    # "decoding ran past", not "stayed busy" (the wait for the model) or "compiling":
    # the limit stops a decode that has streamed text already.
    with pytest.raises(openai.APIError, match=r"decoding ran past .*0\.5 s per request"):
        for chunk in stream:
            pieces.extend(choice.delta.content or "" for choice in chunk.choices)
    assert re.fullmatch("[a-z ]+", "".join(pieces))  # the decode was under way
    assert short_limit.stats["timeout"] == before + 1
    wait_until_idle(server)  # the lock was freed with the loop


def test_a_streamed_prompt_over_the_context_is_400_not_an_error_inside_a_stream(
    client: Any, model: str
) -> None:
    # n_ctx is 8,192 tokens: 9,000 words are past it. The stream's opening waits until the
    # prompt is known to fit, so the refusal is the response's status, before any chunk.
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=model, messages=ask("word " * 9000), max_tokens=4, stream=True
        )
    assert refused.value.code == "context_length_exceeded"
    stream = client.chat.completions.create(
        model=model, messages=ask("Hi"), max_tokens=2, stream=True
    )
    assert [chunk.choices[0].finish_reason for chunk in stream][-1] is not None  # still opens


def test_a_named_tool_call_streams_its_arguments(client: Any, model: str) -> None:
    stream = client.chat.completions.create(
        model=model,
        messages=ask("What is the weather in Paris?"),
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=40,
        temperature=0,
        stream=True,
    )
    deltas, finishes = tool_call_deltas(stream)
    assert deltas[0].id.startswith("call_") and deltas[0].function.name == "get_weather"
    assert all(delta.index == 0 and delta.id is None for delta in deltas[1:])
    arguments = "".join(delta.function.arguments for delta in deltas)
    jsonschema.validate(json.loads(arguments), WEATHER_TOOL["function"]["parameters"])  # type: ignore[index]
    assert finishes[-1] == "tool_calls" and len(deltas) > 1


def test_a_character_split_across_tokens_is_sent_whole(llama_backend: Any) -> None:
    vocabulary = llama_backend.vocabulary
    text = "Olá, 世界 ✓"
    tokens = llama_backend.llm.tokenize(text.encode(), add_bos=False, special=False)
    pieces = [vocabulary.token_bytes[token] for token in tokens]
    assert any(_is_split(piece) for piece in pieces)  # the case under test occurs
    chat = parse_chat_request({"model": "m", "messages": ask("x")}, Limits())
    events: list[str] = []
    writer = ChunkWriter("m", include_usage=False)
    plan = plan_output(chat, vocabulary)
    stream = ChoiceStream(0, plan, vocabulary, writer, lambda event: events.append(event) or True)
    stream.start()
    output: list[int] = []
    for token in tokens:  # one token per step, as the decoding loop shows them
        output.append(token)
        stream.listener.on_output(output)
    # What the steps streamed, before finish() sends whatever they held back.
    contents = [delta for delta in map(_content, events) if delta]
    assert "".join(contents) == text and "\ufffd" not in "".join(contents)
    assert len(contents) > 1  # streamed step by step, each delta whole characters
    streamed = len(events)
    stream.finish(ChoiceOutput(text, "stop"))
    assert not any(map(_content, events[streamed:]))  # nothing held back, nothing sent twice
    chunks = [json.loads(event.removeprefix("data: ")) for event in events if event]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def _content(event: str) -> str:
    """The content delta of a streamed chunk ("" for none)."""
    if not event:
        return ""
    chunk = json.loads(event.removeprefix("data: "))
    return chunk["choices"][0]["delta"].get("content") or ""


def _is_split(piece: bytes) -> bool:
    try:
        piece.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False
