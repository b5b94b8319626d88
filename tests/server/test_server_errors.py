"""Bad input is a 4xx in OpenAI's error shape naming what is wrong (never silently
ignored); limits hold; the API key is enforced; concurrent requests stay valid and
``/health`` answers while the model works. Against a real running server."""

from __future__ import annotations

import functools
import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema
import openai
import pytest

from formline.grammar.budget import CompileBudget
from formline.server import constraints as server_constraints
from formline.server.app import BackgroundServer, create_app

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def post(url: str, data: bytes, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """A raw POST; the status and the JSON body."""
    request = urllib.request.Request(url, data=data, method="POST")
    request.add_header("Content-Type", "application/json")
    for key, value in (headers or {}).items():
        request.add_header(key, value)
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.load(reply)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def post_to_a_server_of(engine: Any, body: dict[str, Any]) -> tuple[int, Any]:
    """``body`` posted to /v1/chat/completions of a server of its own running ``engine``."""
    running = BackgroundServer(create_app(engine)).start()
    try:
        return post(f"{running.url}/v1/chat/completions", json.dumps(body).encode())
    finally:
        running.stop()


def refused(client: Any, model: str, **fields: Any) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(
            model=fields.pop("use_model", model),
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=fields.pop("max_tokens", 5),
            **fields,
        )
    return caught.value


def test_invalid_schema_is_400_with_the_pointer(client: Any, model: str) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "strnig"}}}
    error = refused(
        client,
        model,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    )
    assert error.status_code == 400
    assert "/properties/a" in error.message and error.code == "invalid_schema"
    assert error.param == "response_format.json_schema.schema"


def test_unresolvable_ref_in_a_tool_is_400_naming_the_tool(client: Any, model: str) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"$ref": "#/nope"}}}
    error = refused(
        client, model, tools=[tool], tool_choice={"type": "function", "function": {"name": "f"}}
    )
    assert error.status_code == 400 and error.param == "tools[0].function.parameters"
    assert "$ref" in error.message


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"extra_body": {"guided_whitespace_pattern": " *"}}, "guided_whitespace_pattern"),
        ({"extra_body": {"structured_outputs": {"structural_tag": "x"}}}, "structural_tag"),
        ({"logit_bias": {"1": 5}}, "logit_bias"),
        ({"logprobs": True}, "logprobs"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"stop": ["\n"]}, "stop"),
        ({"response_format": {"type": "grammar"}}, "response_format.type"),
    ],
)
def test_a_field_formline_cannot_honour_is_400_naming_it(
    client: Any, model: str, fields: dict[str, Any], named: str
) -> None:
    error = refused(client, model, **fields)
    assert error.status_code == 400 and named in error.message, error.message
    assert error.code == "unsupported_parameter"


def test_harmless_fields_and_neutral_values_are_accepted(client: Any, model: str) -> None:
    response = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        max_tokens=2,
        user="u1",
        metadata={"k": "v"},
        presence_penalty=0,
        frequency_penalty=0.0,
        logprobs=False,
    )
    assert response.choices[0].finish_reason in ("stop", "length")


def test_conflicting_constraints_are_400(client: Any, model: str) -> None:
    error = refused(
        client, model, response_format={"type": "json_object"}, extra_body={"guided_regex": "a"}
    )
    assert error.status_code == 400 and "guided_regex" in error.message


def test_unknown_model_is_404(client: Any, model: str) -> None:
    error = refused(client, model, use_model="gpt-4o")
    assert error.status_code == 404 and error.code == "model_not_found"


def test_limits_are_400_or_413(client: Any, model: str, server: Any) -> None:
    assert refused(client, model, max_tokens=10_000).status_code == 400
    assert refused(client, model, n=99).status_code == 400
    huge = json.dumps({"model": model, "messages": [{"role": "user", "content": "x" * 300_000}]})
    status, body = post(f"{server.url}/v1/chat/completions", huge.encode())
    assert status == 413 and body["error"]["code"] == "request_too_large"
    assert "Limits.max_request_bytes" in body["error"]["message"]


def test_a_declared_length_over_the_limit_is_refused_before_the_body(server: Any) -> None:
    # The body was read whole first (a 300 MB body: 900 MB of the server's memory).
    host, port = server.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.putrequest("POST", "/v1/chat/completions")
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(10**9))
    connection.endheaders()
    connection.send(b"{")  # one byte of a billion: the answer cannot wait for the rest
    response = connection.getresponse()
    body = json.loads(response.read())
    connection.close()
    assert response.status == 413 and "1000000000 bytes" in body["error"]["message"]


def test_a_lone_surrogate_is_a_400_naming_the_field(server: Any, model: str) -> None:
    # It reached the prompt's UTF-8 encode: a 500 with a traceback.
    body = {"model": model, "max_tokens": 3, "messages": [{"role": "user", "content": "Hi"}]}
    data = json.dumps(body).replace('"Hi"', '"Hi \\ud800"').encode()
    status, body = post(f"{server.url}/v1/chat/completions", data)
    assert status == 400, body
    assert body["error"]["param"] == "messages[0].content"
    assert "lone surrogate" in body["error"]["message"]


@pytest.mark.parametrize(
    ("data", "code"),
    [(b"{not json", "invalid_json"), (b"[1, 2]", "invalid_json"), (b"{}", "missing_required")],
)
def test_malformed_bodies_are_400_in_openai_shape(server: Any, data: bytes, code: str) -> None:
    status, body = post(f"{server.url}/v1/chat/completions", data)
    assert status == 400
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == code


def test_unknown_route_is_404_in_openai_shape(server: Any) -> None:
    status, body = post(f"{server.url}/v1/completions", b"{}")
    assert status == 404 and "message" in body["error"]


def test_api_key_is_required_when_set(engine: Any) -> None:
    secured = BackgroundServer(create_app(engine, api_key="sesame")).start()
    try:
        wrong = openai.OpenAI(base_url=f"{secured.url}/v1", api_key="nope", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
        right = openai.OpenAI(base_url=f"{secured.url}/v1", api_key="sesame", max_retries=0)
        assert right.models.list().data[0].id == engine.model_id
    finally:
        secured.stop()


def test_concurrent_requests_all_validate_and_health_answers(
    client: Any, model: str, server: Any
) -> None:
    def one(index: int) -> str:
        response = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": f"Invent person number {index}."}],
            response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}},
            max_tokens=40,
            temperature=0.8,
            seed=index,
        )
        return str(response.choices[0].message.content)

    health_times: list[float] = []

    def poll_health(stop: threading.Event) -> None:
        while not stop.is_set():
            started = time.perf_counter()
            with urllib.request.urlopen(f"{server.url}/health", timeout=10) as reply:
                json.load(reply)
            health_times.append(time.perf_counter() - started)
            time.sleep(0.05)

    stop = threading.Event()
    poller = threading.Thread(target=poll_health, args=(stop,))
    poller.start()
    with ThreadPoolExecutor(4) as pool:
        texts = list(pool.map(one, range(6)))
    stop.set()
    poller.join()
    for text in texts:
        jsonschema.validate(json.loads(text), PERSON)
    assert health_times and max(health_times) < 1.0


class BrokenBackend:
    """The real model's vocabulary, tokenizer and chat template, but every forward pass
    fails."""

    name = "broken"

    def __init__(self, real: Any):
        self.real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def forward(self, token_ids: list[int]) -> Any:
        raise RuntimeError("the engine crashed")


def test_a_real_fault_is_500_and_logged(engine: Any, caplog: pytest.LogCaptureFixture) -> None:
    from formline.server.engine import Engine

    broken = Engine(BrokenBackend(engine.backend), engine.model_id, engine.limits)
    body = {"model": engine.model_id, "messages": [{"role": "user", "content": "Hi"}]}
    status, reply = post_to_a_server_of(broken, body)
    assert status == 500 and reply["error"]["type"] == "server_error"
    assert "the engine crashed" in reply["error"]["message"]
    assert any("server fault" in record.getMessage() for record in caplog.records)


def test_messages_the_chat_template_refuses_are_400(
    engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A template's own check (raise_exception, as templates that need alternating roles
    # do) is the request's fault: it was a 500.
    formats = pytest.importorskip("llama_cpp.llama_chat_format", reason="needs the llama extra")
    refusing = formats.Jinja2ChatFormatter(
        template="{{ raise_exception('roles must alternate') }}", eos_token="", bos_token=""
    )
    monkeypatch.setattr(engine.backend, "_chat_formatter", refusing)
    body = {"model": engine.model_id, "messages": [{"role": "user", "content": "Hi"}]}
    status, reply = post_to_a_server_of(engine, body)
    assert status == 400 and reply["error"]["param"] == "messages"
    assert "roles must alternate" in reply["error"]["message"]


def test_a_limit_met_while_decoding_is_400_naming_the_constraint(
    engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 0{3}[a-z]*a[a-z]{20} can need 2^21 DFA states, made as decoding reaches them: past
    # a budget of 100, the first mask after "000" raises in the loop (it was a 500).
    monkeypatch.setattr(
        server_constraints, "CompileBudget", functools.partial(CompileBudget, dfa_states=100)
    )
    body = {
        "model": engine.model_id,
        "messages": [{"role": "user", "content": "Write a code."}],
        "guided_regex": "0{3}[a-z]*a[a-z]{20}",
        "max_tokens": 20,
    }
    status, reply = post_to_a_server_of(engine, body)
    assert status == 400 and reply["error"]["code"] == "compile_limit_exceeded"
    assert (
        reply["error"]["param"] == "guided_regex" and "100 DFA states" in reply["error"]["message"]
    )


def test_a_dropped_non_streaming_client_stops_its_decoding(server: Any, model: str) -> None:
    # It kept the model decoding to max_tokens while the next request waited.
    def cancelled() -> int:
        with urllib.request.urlopen(f"{server.url}/health", timeout=30) as response:
            return int(json.loads(response.read())["loops"].get("cancelled", 0))

    before = cancelled()
    body = {
        "model": model,
        "max_tokens": 300,
        "messages": [{"role": "user", "content": "Write letters."}],
        "guided_regex": "[a-z ]{600}",  # longer than 300 tokens: only a stop ends it early
    }
    host, port = server.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.request("POST", "/v1/chat/completions", json.dumps(body).encode(),
                       {"Content-Type": "application/json"})  # fmt: skip
    time.sleep(0.5)  # decoding has begun
    connection.sock.close()  # the client goes away without reading the answer
    waited = 0.0
    while cancelled() == before and waited < 120:  # the loop stops at its next step
        time.sleep(0.25)
        waited += 0.25
    assert cancelled() == before + 1


def test_a_malformed_tool_is_refused_even_when_it_may_not_be_called(engine: Any) -> None:
    # tool_choice "none" left the tools' schemas unchecked (OpenAI refuses them).
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}
    body = {
        "model": engine.model_id,
        "messages": [{"role": "user", "content": "Hi"}],
        "tools": [tool],
        "tool_choice": "none",
        "max_tokens": 2,
    }
    status, reply = post_to_a_server_of(engine, body)
    assert status == 400 and reply["error"]["code"] == "invalid_schema"
    assert reply["error"]["param"] == "tools[0].function.parameters"
