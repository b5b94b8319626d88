"""How ``generate`` shapes the answer's form: objects closed (a Pydantic model's schema
leaves them open), JSON indented as the model likes, the schema described as a field list.
Scripted logits over the real SmolLM2 tokenizer and the real loop."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel

from formline.constraint import Constraint
from formline.pipeline.generate import generate
from scripted import ScriptedEngine

PRETTY = '{\n  "name": "Ada Lovelace",\n  "age": 36\n}'


class Person(BaseModel):
    name: str
    age: int


def test_a_pydantic_object_is_closed_so_the_schema_is_not_echoed(llama_backend: Any) -> None:
    echo = '{"name":"Ada","age":36,"type":"integer"}'
    engine = ScriptedEngine(llama_backend, echo, echo)
    result = generate("Ada, 36.", Person, engine, max_tokens=40)
    assert set(json.loads(result.text)) == {"name", "age"}  # no room for the echoed key
    assert result.value.name == "Ada" and not result.errors
    # The same schema left open (a Constraint is taken as given) lets the echo through.
    open_schema = Constraint("json_schema", Person)
    assert generate("Ada, 36.", open_schema, engine, max_tokens=40).text == echo


def test_indented_json_is_written_as_the_model_likes_it(llama_backend: Any) -> None:
    engine = ScriptedEngine(llama_backend, PRETTY, PRETTY)
    pretty = generate("Ada, 36.", Person, engine, whitespace=16, max_tokens=40)
    assert pretty.text == PRETTY and pretty.value.age == 36
    compact = generate("Ada, 36.", Person, engine, whitespace=None, max_tokens=40)
    assert compact.text != PRETTY and "\n" not in compact.text  # compact JSON refuses it
    # A Constraint is taken as given: its own (compact) whitespace, not generate's default.
    given = generate(
        "Ada, 36.",
        Constraint("json_schema", Person),
        ScriptedEngine(llama_backend, PRETTY),
        max_tokens=40,
    )
    assert "\n" not in given.text


def test_the_field_list_describes_the_schema_without_its_keywords(llama_backend: Any) -> None:
    seen: list[str] = []

    class Recording(ScriptedEngine):
        def render_chat(self, messages: list[dict[str, str]]) -> str:
            seen.append(messages[-1]["content"])
            return super().render_chat(messages)

    engine = Recording(llama_backend, '{"name":"Ada","age":36}', '{"name":"Ada","age":36}')
    generate("Ada, 36.", Person, engine, describe_schema="fields", max_tokens=40)
    generate("Ada, 36.", Person, engine, describe_schema=True, max_tokens=40)
    fields, schema = seen
    assert "- name (string)\n- age (integer)" in fields and '"title"' not in fields
    assert json.dumps(Person.model_json_schema(), separators=(",", ":")) in schema
    with pytest.raises(ValueError, match="describe_schema"):
        generate("x", Person, engine, describe_schema="prose")
