"""``formline.stream``: partial values while decoding, then the final value or the typed
errors, sync and async, on the real loop (scripted logits, then the embedded model)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest
from pydantic import BaseModel, Field

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


class Node(BaseModel):
    name: str
    children: list[Node] = []


def test_a_recursive_model_streams_partial_trees(llama_backend: Any) -> None:
    # Its partial twin recursed until RecursionError, raised with the loop still running.
    answer = '{"name":"root","children":[{"name":"leaf","children":[]}]}'
    engine = ScriptedEngine(llama_backend, answer)
    *partials, final = formline.stream("Tree?", Node, engine, describe_schema=False)
    assert final == Node(name="root", children=[Node(name="leaf")])
    twin = partial_model(Node)
    assert partials and all(isinstance(item, twin) for item in partials)
    assert any(item.children and item.children[0].children is None for item in partials)


def _stream_workers() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "formline-stream"]


def test_a_partial_model_that_fails_starts_no_decoding(
    llama_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The reader was built after the worker started and outside the try: its error left
    # the worker decoding to max_tokens, holding the engine's turn.
    def refuse(model: Any) -> Any:
        raise TypeError(f"no partial twin for {model.__name__}")

    monkeypatch.setattr("formline.pipeline.stream.partial_model", refuse)
    engine = SlowEngine(llama_backend, ANSWER)
    with pytest.raises(TypeError, match="no partial twin"):
        list(formline.stream("Who?", Person, engine, describe_schema=False))

    async def collect() -> list[Any]:
        stream = formline.stream("Who?", Person, engine, describe_schema=False)
        return [item async for item in stream]

    with pytest.raises(TypeError, match="no partial twin"):
        asyncio.run(collect())
    assert _stream_workers() == [] and engine.fed == []  # nothing decoded, no worker left
    again = formline.generate("Who?", Person, engine, describe_schema=False)
    assert again.value == Person(name="Ada Lovelace", age=36)  # the engine's turn is free


class Resident(BaseModel):
    name: str
    age: int
    city: str


def test_a_tolerant_stream_yields_partial_instances(llama_backend: Any) -> None:
    # numbers="tolerant" compiles a rewritten schema without the model: the partials were
    # plain dicts. A spelled-out age fails the twin's int: that field alone is left out.
    answer = '{"name":"Ada","age":"thirty-six","city":"London town"}'
    engine = ScriptedEngine(llama_backend, answer)
    stream = formline.stream("Who?", Resident, engine, describe_schema=False, numbers="tolerant")
    *partials, final = stream
    assert final == Resident(name="Ada", age=36, city="London town")
    twin = partial_model(Resident)
    assert partials and all(isinstance(item, twin) for item in partials)
    assert all(item.age is None for item in partials)
    assert partials[-1].city == "London town" and partials[-1].name == "Ada"


class Aliased(BaseModel):
    name: str = Field(alias="fullName")
    pair: tuple[int, str]
    tail: str


def test_aliases_and_fixed_tuples_stream(llama_backend: Any) -> None:
    # An aliased field never showed (the twin had no alias); a whole tuple[int, str] failed
    # the twin's list[int], and nothing after it streamed.
    answer = '{"fullName":"Ada Lovelace","pair":[1,"a"],"tail":"long tail text"}'
    engine = ScriptedEngine(llama_backend, answer)
    *partials, final = formline.stream("Who?", Aliased, engine, describe_schema=False)
    assert final == Aliased(fullName="Ada Lovelace", pair=(1, "a"), tail="long tail text")
    names = [item.name for item in partials if item.name]
    assert names and names[-1] == "Ada Lovelace"
    assert partials[-1].pair == (1, "a") and partials[-1].tail == "long tail text"
    assert any(item.tail == "long" for item in partials)
