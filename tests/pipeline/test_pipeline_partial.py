"""Partial JSON of a growing text, and the partial twin of a Pydantic model."""

from __future__ import annotations

import json
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field, field_validator

from formline.pipeline.partial import NOTHING, PartialJson, partial_model


def values_along(text: str) -> list[object]:
    reader, seen = PartialJson(), []
    for character in text:
        reader.feed(character)
        value = reader.value()
        if value is not NOTHING and (not seen or seen[-1] != value):
            seen.append(value)
    return seen


def test_strings_grow_numbers_and_keys_wait() -> None:
    seen = values_along('{"name":"Ada","age":36,"tags":["a","bc"],"ok":true}')
    assert seen[0] == {}
    assert {"name": "A"} in seen and {"name": "Ada"} in seen
    assert {"name": "Ada", "age": 3} not in seen  # 3 may still become 36
    assert {"name": "Ada", "age": 36} in seen
    assert {"name": "Ada", "age": 36, "tags": ["a", "b"]} in seen
    assert not any(
        isinstance(value, dict) and "ok" in value and value["ok"] is None for value in seen
    )
    assert seen[-1] == {"name": "Ada", "age": 36, "tags": ["a", "bc"], "ok": True}


def test_escapes_wait_for_their_last_character() -> None:
    reader = PartialJson()
    reader.feed('{"a":"x\\')
    assert reader.value() == {"a": "x"}  # "x" then an escape: the escape waits for its end
    reader.feed("u00e")
    assert reader.value() == {"a": "x"}
    reader.feed('9"}')
    assert reader.value() == {"a": "xé"} and reader.done


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(JSON, st.sampled_from([(",", ":"), (", ", ": ")]))
def test_every_prefix_gives_a_value_that_the_whole_extends(
    value: object, separators: tuple[str, str]
) -> None:
    text = json.dumps(value, separators=separators)
    reader = PartialJson()
    for character in text:
        reader.feed(character)
        partial = reader.complete_value()
        # A cut is a promise that the text up to it, closed, is a value: nothing only before.
        assert (partial is NOTHING) == (not reader.cut)
        assert partial is NOTHING or _is_prefix_of(partial, value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        assert reader.value() == value  # a top-level number never ends: no delimiter follows


def _is_prefix_of(partial: object, whole: object) -> bool:
    if isinstance(partial, dict) and isinstance(whole, dict):
        return all(
            key in whole and _is_prefix_of(item, whole[key]) for key, item in partial.items()
        )
    if isinstance(partial, list) and isinstance(whole, list):
        return len(partial) <= len(whole) and all(map(_is_prefix_of, partial, whole))
    return partial == whole


class City(BaseModel):
    name: str
    country: Literal["France", "Spain"]


class Person(BaseModel):
    name: str = Field(min_length=2)
    age: int
    home: City
    visited: list[City] = []

    @field_validator("name")
    @classmethod
    def never_partial(cls, name: str) -> str:
        raise ValueError("validators are not part of the partial twin")


def test_the_partial_twin_takes_half_decoded_values() -> None:
    partial = partial_model(Person)
    assert partial is partial_model(Person)  # cached
    half = partial.model_validate({"name": "A", "home": {"name": "Par"}, "visited": [{}]})
    assert half.name == "A" and half.age is None
    assert half.home.name == "Par" and half.home.country is None
    assert half.visited[0].name is None
    with pytest.raises(ValueError):
        partial.model_validate({"home": {"country": "Fra"}})  # a wrong literal still fails


def test_an_escape_being_written_keeps_the_string_before_it() -> None:
    # SmolLM2 writes "\n" as the tokens "\" and "n": between them the string was dropped
    # (the field went back to None, at the top level the object to {}).
    reader = PartialJson()
    values = []
    for character in '{"body":"Line one\\nTwo \\u00e9"}':
        reader.feed(character)
        values.append(reader.value())
    bodies = [value.get("body") for value in values if isinstance(value, dict)]
    written = [body for body in bodies if body is not None]
    assert written == sorted(written, key=len) and written[-1] == "Line one\nTwo é"
    assert bodies.index("Line one") < bodies.index("Line one\n")
    assert all(body is not None for body in bodies[bodies.index("") :])
