"""Every malformed request field is a 400 naming the field (``param``), never a 500; and the
after-check reads each answer against the client's own schema. No model needed here (the
same bodies go to a running server in test_server_hostile)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hostile_bodies import CASES, RAW_BODIES, TOOL, body_for, tool

from formline.constraint import Constraint, Plan
from formline.pipeline.decoding import Generation
from formline.schema.api import SchemaCheck
from formline.server.engine import INVALID_FINISH, read_choice
from formline.server.errors import ApiError
from formline.server.requests import SEED_RANGE, Limits, parse_body, parse_chat_request


@pytest.mark.parametrize(("label", "changes", "param"), CASES, ids=[case[0] for case in CASES])
def test_a_malformed_field_is_a_400_naming_it(
    label: str, changes: dict[str, Any], param: str
) -> None:
    with pytest.raises(ApiError) as caught:
        parse_chat_request(body_for("m", changes), Limits())
    assert caught.value.status == 400, label
    assert caught.value.param == param, (label, caught.value.message)


@pytest.mark.parametrize(("label", "raw"), RAW_BODIES, ids=[case[0] for case in RAW_BODIES])
def test_a_body_that_is_not_strict_json_is_a_400(label: str, raw: bytes) -> None:
    with pytest.raises(ApiError) as caught:
        parse_body(raw, Limits())
    assert caught.value.status == 400 and caught.value.code == "invalid_json", label


def test_the_seed_range_is_named_and_its_ends_are_accepted() -> None:
    low, high = SEED_RANGE
    for seed in (low, high):
        assert parse_chat_request(body_for("m", {"seed": seed}), Limits()).seed == seed
    with pytest.raises(ApiError) as caught:
        parse_chat_request(body_for("m", {"seed": -1}), Limits())
    assert f"between {low} and {high}" in caught.value.message


def test_two_tools_with_one_name_name_both_indexes() -> None:
    body = body_for("m", {"tools": [TOOL, tool(name="g"), tool(description="again")]})
    with pytest.raises(ApiError) as caught:
        parse_chat_request(body, Limits())
    assert "tools[0]" in caught.value.message and "tools[2]" in caught.value.message
    assert caught.value.code == "duplicate_tool_name"


def test_well_formed_fields_still_parse() -> None:
    messages = [
        {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": "Weather?", "name": "ann"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": "sunny"},
    ]
    request = parse_chat_request(
        body_for("m", {"messages": messages, "tools": [TOOL, tool(name="g")], "seed": 7}),
        Limits(),
    )
    assert [message["role"] for message in request.messages] == [
        "system", "user", "assistant", "tool",
    ]  # fmt: skip
    assert json.loads(request.messages[2]["content"]) == {"name": "f", "arguments": {}}
    assert [entry.name for entry in request.tools] == ["f", "g"]


def generation(text: str, finish: str = "stop") -> Generation:
    return Generation(token_ids=[], text=text, finish_reason=finish, prompt_tokens=1,
                      completion_tokens=1)  # fmt: skip


def test_an_answer_the_clients_schema_refuses_is_reported_not_stop() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    constraint = Constraint("json_schema", schema, close_objects=True)
    plan = Plan(constraint, None, client_check=SchemaCheck(schema))
    valid = read_choice(generation('{"a": 1}'), plan)
    assert valid.finish_reason == "stop" and not valid.errors
    invalid = read_choice(generation('{"a": "one"}'), plan)
    assert invalid.finish_reason == INVALID_FINISH
    assert any("is not of type 'integer'" in error for error in invalid.errors)
    broken = read_choice(generation('{"a": 1'), plan)
    assert broken.finish_reason == INVALID_FINISH and broken.errors[0].startswith("not JSON")


def test_an_answer_nested_past_the_json_reader_is_reported_not_a_fault() -> None:
    # A json_object (or recursive) grammar lets 3,000 nested arrays through; json.loads
    # raised RecursionError on them, a 500.
    plan = Plan(Constraint("json_object", None), None)
    deep = read_choice(generation("[" * 3000 + "]" * 3000), plan)
    assert deep.finish_reason == INVALID_FINISH and "nests deeper" in deep.errors[0]


def test_the_clients_format_is_checked_with_its_drafts_checker() -> None:
    check = SchemaCheck({"type": "string", "format": "date"})
    assert check.check("2024-02-30") and not check.check("2024-02-29")
