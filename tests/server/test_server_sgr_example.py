"""Seed 001's SGR agent (examples/sgr_pricing) end to end against the running server, and
the vLLM-style closing of open objects it relies on."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from formline.schema.closing import close_objects

AGENT = Path(__file__).resolve().parents[2] / "examples" / "sgr_pricing" / "agent.py"


def load_agent() -> Any:
    spec = importlib.util.spec_from_file_location("sgr_pricing_agent", AGENT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # Pydantic resolves the postponed annotations through it
    spec.loader.exec_module(module)
    return module


def test_open_objects_are_closed_like_xgrammar() -> None:
    schema = {
        "$defs": {"A": {"properties": {"x": {"type": "object", "properties": {}}}}},
        "properties": {"a": {"$ref": "#/$defs/A"}, "l": {"items": {"properties": {}}}},
        "required": ["a"],
    }
    closed = close_objects(schema)
    assert closed["additionalProperties"] is False
    assert closed["$defs"]["A"]["additionalProperties"] is False
    assert closed["$defs"]["A"]["properties"]["x"]["additionalProperties"] is False
    assert closed["properties"]["l"]["items"]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # the input is unchanged
    kept = {"properties": {}, "additionalProperties": {"type": "integer"}}
    assert close_objects(kept) == kept
    composed = {"allOf": [{"properties": {"a": {}}}], "properties": {"b": {}}}
    assert close_objects(composed) == composed


def test_the_sgr_agent_runs_end_to_end(server: Any) -> None:
    agent_module = load_agent()
    store = agent_module.open_store(":memory:")
    agent = agent_module.Agent(f"{server.url}/v1", store, max_tokens=160)
    reply = agent.handle("I want a discount or I'm leaving!", "user_102")
    assert isinstance(reply, str) and reply
    rows = store.execute("SELECT phase, schema, raw FROM audit ORDER BY at").fetchall()
    phases = [phase for phase, _, _ in rows]
    assert phases[0] == "route"
    for phase, schema_name, raw in rows:
        if raw:  # every model answer parses as its schema (check rows carry no raw text)
            getattr(agent_module, schema_name).model_validate_json(raw)
            assert "title" not in json.loads(raw), phase
