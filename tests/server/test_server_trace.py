"""``POST /trace``: the explainer page recorded on the served model."""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from typing import Any

from server_tools import health


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


def test_a_dropped_trace_client_frees_the_model(server: Any) -> None:
    # The recording went on for 133 s after its client had gone, every request waiting.
    before = health(server.url)["loops"]["cancelled"]
    schema = {"type": "object", "properties": {"story": {"type": "string"}}}
    body = {"prompt": "A long story.", "schema": schema, "max_tokens": 256, "free_samples": 8}
    host, port = server.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.request("POST", "/trace", json.dumps(body).encode(),
                       {"Content-Type": "application/json"})  # fmt: skip
    waited = 0.0
    while not health(server.url)["busy"] and waited < 60:  # the recording has begun
        time.sleep(0.1)
        waited += 0.1
    connection.sock.close()  # the client goes away without reading the page
    state = health(server.url)
    while (state["busy"] or state["loops"]["cancelled"] == before) and waited < 120:
        time.sleep(0.25)  # the recording stops at its next step, and frees the model
        waited += 0.25
        state = health(server.url)
    assert state["loops"]["cancelled"] == before + 1
