"""``POST /trace``: the explainer page recorded on the served model."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


def post(url: str, body: dict[str, Any]) -> tuple[int, str]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_trace_page_is_recorded_and_self_contained(server: Any) -> None:
    schema = {
        "type": "object",
        "properties": {"age": {"type": "integer"}},
        "required": ["age"],
        "additionalProperties": False,
    }
    status, page = post(
        f"{server.url}/trace",
        {"prompt": "Ada is 36.", "schema": schema, "free_samples": 1, "max_tokens": 12},
    )
    assert status == 200 and page.lstrip().lower().startswith("<!doctype html")
    assert "application/json" in page and "https://" not in page.split("<script", 1)[0]


def test_trace_refuses_bad_requests_with_the_field(server: Any) -> None:
    status, body = post(f"{server.url}/trace", {"prompt": "x"})
    assert status == 400 and "schema" in body
    status, body = post(f"{server.url}/trace", {"prompt": "x", "schema": {}, "max_tokens": 10**6})
    assert status == 400 and json.loads(body)["error"]["param"] == "max_tokens"
    # A schema past a compile limit is coded as one, as on /v1 (it was "invalid_schema").
    huge = {"type": "array", "items": {"type": "string"}, "minItems": 100_000}
    status, body = post(f"{server.url}/trace", {"prompt": "x", "schema": huge})
    error = json.loads(body)["error"]
    assert status == 400 and error["code"] == "compile_limit_exceeded"
    assert error["param"] == "schema" and "minItems" in error["message"]
