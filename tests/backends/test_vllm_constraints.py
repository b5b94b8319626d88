"""A vLLM request's formline constraint (``vllm_xargs``), read and compiled without vLLM."""

from __future__ import annotations

import json
from typing import Any

import pytest

from formline.backends.vllm import KEYS, read_constraint, vllm_xargs
from formline.backends.vllm.constraints import compiled_for, grammar_for
from formline.mask.matcher import GrammarMatcher
from formline.vocab import Vocabulary

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_no_formline_key_is_no_constraint() -> None:
    assert read_constraint(None) is None
    assert read_constraint({}) is None
    assert read_constraint({"session_id": "abc"}) is None  # other vllm_xargs pass through


def test_a_schema_travels_as_json_text_and_compiles(smollm2_vocab: Vocabulary) -> None:
    extra = vllm_xargs(json_schema=PERSON)
    assert extra == {"formline_json_schema": json.dumps(PERSON)}
    constraint = read_constraint(extra)
    assert constraint is not None and constraint.value == PERSON
    matcher = GrammarMatcher(compiled_for(constraint, smollm2_vocab))
    assert matcher.accept_string('{"name":"Ana","age":31}') and matcher.can_end()
    refused = GrammarMatcher(compiled_for(constraint, smollm2_vocab))
    assert not refused.accept_string('{"name":"Ana","age":"31"}')


@pytest.mark.parametrize(
    ("extra", "text", "accepted"),
    [
        ({"formline_regex": r"\d{4}-\d{2}"}, "2024-05", True),
        ({"formline_regex": r"\d{4}-\d{2}"}, "2024-5", False),
        ({"formline_choice": ["red", "green"]}, "green", True),
        ({"formline_choice": json.dumps(["red", "green"])}, "blue", False),
        ({"formline_grammar": 'root ::= "yes" | "no"'}, "no", True),
        ({"formline_json_schema": PERSON, "formline_whitespace": 1}, '{"name": "A","age":1}', True),
    ],
)
def test_each_kind_constrains_the_whole_output(
    extra: dict[str, Any], text: str, accepted: bool, smollm2_vocab: Vocabulary
) -> None:
    constraint = read_constraint(extra)
    assert constraint is not None
    matcher = GrammarMatcher(compiled_for(constraint, smollm2_vocab))
    assert (matcher.accept_string(text) and matcher.can_end()) is accepted


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"formline_regex": "a", "formline_choice": ["a"]}, "give one constraint"),
        ({"formline_regx": "a"}, "formline_regx is not a formline key"),
        ({"formline_whitespace": 2}, "needs one of"),
        ({"formline_json_schema": "{not json"}, "not valid JSON"),
        # json.loads recurses per level: a RecursionError was vLLM's 500, with no message.
        ({"formline_json_schema": "[" * 100_000 + "]" * 100_000}, "formline_json_schema is JSON"),
        ({"formline_choice": '{"a":' * 5000 + "1" + "}" * 5000}, "formline_choice is JSON nested"),
        ({"formline_json_schema": "[1]"}, "must be a JSON Schema"),
        ({"formline_choice": []}, "non-empty list of strings"),
        ({"formline_regex": ""}, "non-empty string"),
        ({"formline_regex": "a", "formline_whitespace": -1}, "from 0 to 64"),
    ],
)
def test_malformed_xargs_name_the_key(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        read_constraint(extra)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"formline_json_schema": {"properties": {"a": {"pattern": "(?=x)"}}}},
            r"keyword 'pattern'\) at JSON pointer /properties/a",
        ),
        ({"formline_json_schema": {"$ref": "#/$defs/missing"}}, "formline_json_schema"),
        ({"formline_regex": "(("}, "formline_regex does not compile"),
        ({"formline_grammar": "root ::= missing"}, "formline_grammar does not compile"),
        # Found when the automaton is built, not when the text is parsed: in the engine's
        # step they would stop vLLM's engine.
        ({"formline_grammar": 'root ::= root "a" | "a"'}, "left recursion"),
        ({"formline_grammar": 'root ::= "a" root'}, "formline_grammar does not compile"),
    ],
)
def test_constraints_that_do_not_compile_are_refused_before_any_model(
    extra: dict[str, Any], message: str
) -> None:
    constraint = read_constraint(extra)
    assert constraint is not None
    with pytest.raises(ValueError, match=message):
        grammar_for(constraint)


def test_vllm_xargs_needs_exactly_one_constraint() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        vllm_xargs()
    with pytest.raises(ValueError, match="exactly one"):
        vllm_xargs(regex="a", choice=["a"])
    assert vllm_xargs(choice=["a"], whitespace=2) == {
        "formline_choice": ["a"],
        "formline_whitespace": 2,
    }
    assert set(KEYS) == {
        "formline_json_schema",
        "formline_regex",
        "formline_choice",
        "formline_grammar",
    }
