"""``formline.stream``: partial values while decoding, then the final value or the typed
errors, sync and async, on the real loop (scripted logits, then the embedded model)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from pydantic import BaseModel

import formline
from formline.backends.base import BackendError
from formline.pipeline.decoding import Sampling, decode
from formline.pipeline.generate import TruncatedOutput
from formline.pipeline.partial import partial_model
from scripted import ScriptedEngine


class Person(BaseModel):
    name: str
    age: int


ANSWER = '{"name":"Ada Lovelace","age":36}'


def test_a_model_streams_partial_instances_then_the_value(llama_backend: Any) -> None:
    engine = ScriptedEngine(llama_backend, ANSWER)
    stream = formline.stream("Who?", Person, engine, describe_schema=False)
    items = list(stream)
    *partials, final = items
    assert final == Person(name="Ada Lovelace", age=36) and isinstance(final, Person)
    twin = partial_model(Person)
    assert partials and all(isinstance(item, twin) for item in partials)
    names = [item.name for item in partials if item.name]
    assert names[0] != "Ada Lovelace" and names[-1] == "Ada Lovelace"  # it filled in
    assert any(item.age is None and item.name for item in partials)
    assert stream.result is not None and stream.result.text == ANSWER == stream.text


def test_a_schema_streams_dicts_and_text_streams_text(llama_backend: Any) -> None:
    schema = Person.model_json_schema()
    items = list(formline.stream("Who?", schema, ScriptedEngine(llama_backend, ANSWER)))
    assert items[-1] == json.loads(ANSWER) and all(isinstance(item, dict) for item in items)
    texts = list(formline.stream("Hi", None, ScriptedEngine(llama_backend, "Hello there.")))
    assert texts[-1] == "Hello there." and all("Hello there.".startswith(t) for t in texts)


def test_a_cut_off_stream_ends_with_the_typed_error(llama_backend: Any) -> None:
    engine = ScriptedEngine(llama_backend, "one two three four five six seven")
    stream = formline.stream("Count", None, engine, max_tokens=3)
    seen = []
    with pytest.raises(TruncatedOutput):
        for item in stream:
            seen.append(item)
    assert seen and stream.result is not None and stream.result.finish_reason == "length"


def test_leaving_early_stops_the_loop(llama_backend: Any) -> None:
    engine = ScriptedEngine(llama_backend, "word " * 200)
    stream = formline.stream("Go", None, engine, max_tokens=200)
    for _ in stream:
        break
    assert len(engine.fed) < 100  # stopped at its next step, not run to max_tokens
    with pytest.raises(RuntimeError, match="once"):
        list(stream)


def test_async_iteration_gives_the_same_items(llama_backend: Any) -> None:
    async def collect() -> list[Any]:
        stream = formline.stream("Who?", Person, ScriptedEngine(llama_backend, ANSWER))
        return [item async for item in stream]

    synced = list(formline.stream("Who?", Person, ScriptedEngine(llama_backend, ANSWER)))
    assert asyncio.run(collect()) == synced


def test_the_embedded_model_streams_a_valid_person(llama_backend: Any) -> None:
    items = list(
        formline.stream("Ada Lovelace, 36, from London. Give name and age.", Person, llama_backend)
    )
    assert isinstance(items[-1], Person) and len(items) >= 3


class SlowEngine(ScriptedEngine):
    """A scripted engine whose passes take a while, so a second caller meets one running."""

    def forward(self, token_ids: list[int]) -> Any:
        time.sleep(0.005)
        return super().forward(token_ids)


def test_a_generate_inside_a_stream_waits_for_the_streams_turn(llama_backend: Any) -> None:
    # The stream decodes on a worker thread; a generate on the same engine meanwhile reset
    # the engine under it (llama.cpp crashed: a segmentation fault or an abort).
    engine = SlowEngine(llama_backend, ANSWER, '{"name":"Grace Hopper","age":85}')
    inner = None
    items = []
    for item in formline.stream("Who?", Person, engine, describe_schema=False):
        if len(items) == 1:
            inner = formline.generate("Who else?", Person, engine, describe_schema=False)
        items.append(item)
    assert items[-1] == Person(name="Ada Lovelace", age=36)
    assert inner is not None and inner.value == Person(name="Grace Hopper", age=85)


def test_decoding_again_on_the_same_thread_is_a_named_error(llama_backend: Any) -> None:
    # A callback of the loop that decodes on its engine would wait for its own turn.
    engine = ScriptedEngine(llama_backend, "Hello there.", "Again.")

    def nested(tokens: list[int]) -> bool:
        decode(engine, "Nested?", None, Sampling())
        return True

    with pytest.raises(BackendError, match="already decoding on this thread"):
        decode(engine, "Hi", None, Sampling(on_tokens=nested))
    assert decode(engine, "Hi", None, Sampling()).finish_reason == "stop"  # the turn is free
