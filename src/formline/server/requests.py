"""Parse and check a ``POST /v1/chat/completions`` body into a :class:`ChatRequest`.

Every field is either honoured, on an explicit list of fields harmless to ignore, or
accepted only at its neutral value (``presence_penalty: 0``, ``logprobs: false``, ...);
anything else is a 400 naming the field, never silently dropped. A field whose value is
``null`` counts as absent. The output constraint comes from exactly one of
``response_format``, vLLM's ``structured_outputs`` / ``guided_*`` fields, or ``tools``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from formline.server.errors import ApiError, unsupported

HONOURED = frozenset(
    {
        "model", "messages", "response_format", "structured_outputs", "guided_json",
        "guided_regex", "guided_choice", "guided_grammar", "max_tokens",
        "max_completion_tokens", "temperature", "top_p", "seed", "n", "stream",
        "stream_options", "tools", "tool_choice", "parallel_tool_calls",
    }
)  # fmt: skip
# Harmless to ignore: bookkeeping. vLLM's guided_decoding_backend (sent by existing clients,
# e.g. seed 001's) names the engine that enforces the constraint: formline enforces it with
# its own, so the constraint still holds.
IGNORED = frozenset({"user", "metadata", "store", "service_tier", "guided_decoding_backend"})
# Accepted only at the value that changes nothing.
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "frequency_penalty": (0, 0.0),
    "presence_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0),
    "logprobs": (False,),
    "top_logprobs": (0,),
    "logit_bias": ({},),
    "stop": ([],),
}
STRUCTURED_KEYS = ("json", "regex", "choice", "grammar", "json_object")
ROLES = {"system": "system", "developer": "system", "user": "user"}
ROLES.update({"assistant": "assistant", "tool": "tool"})


@dataclass(frozen=True)
class Limits:
    """What one request may ask for; each is a ``formline serve`` option."""

    max_request_bytes: int = 1_000_000
    max_schema_bytes: int = 100_000
    max_tokens_cap: int = 2048
    default_max_tokens: int = 256
    max_n: int = 8
    request_seconds: float = 300.0  # waiting for the model plus decoding, per request
    max_tool_calls: int = 8  # tool calls in one answer (parallel_tool_calls)


@dataclass(frozen=True)
class Constraint:
    """The output constraint: ``kind`` is text, json_schema, json_object, regex, choice or
    grammar; ``value`` the schema / pattern / options / grammar text; ``param`` where it
    came from (for error messages)."""

    kind: str = "text"
    value: Any = None
    strict: bool = True
    param: str = ""


@dataclass(frozen=True)
class Tool:
    """One function tool: its name, description and parameters schema."""

    name: str
    description: str
    parameters: dict[str, Any]
    strict: bool


@dataclass
class ChatRequest:
    """A checked chat completion request."""

    model: str
    messages: list[dict[str, str]]
    constraint: Constraint
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    tools: list[Tool] = field(default_factory=list)
    tool_choice: str = "none"  # none, auto, required, named
    named_tool: str | None = None
    parallel_tool_calls: bool = True  # OpenAI's default: several calls in one answer
    max_tool_calls: int = 8  # the server's limit (Limits.max_tool_calls)


def parse_body(raw: bytes, limits: Limits) -> dict[str, Any]:
    """The request body as a JSON object.

    Raises:
        ApiError: 413 over ``max_request_bytes``; 400 not JSON, or not an object.
    """
    if len(raw) > limits.max_request_bytes:
        raise ApiError(
            f"the request has {len(raw)} bytes; the limit is {limits.max_request_bytes}",
            status=413,
            code="request_too_large",
        )
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ApiError(
            f"the request body is not valid JSON: {error}", code="invalid_json"
        ) from error
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object", code="invalid_json")
    return {key: value for key, value in body.items() if value is not None}


def parse_chat_request(body: dict[str, Any], limits: Limits) -> ChatRequest:
    """Check every field of a chat completion body (already without ``null`` values).

    Raises:
        ApiError: 400 for a missing, malformed, conflicting or unsupported field (named).
    Costs O(size of the body) plus one ``json.dumps`` of each schema (its size limit).
    """
    _refuse_unknown(body)
    if "model" not in body or not isinstance(body["model"], str):
        raise ApiError("'model' is required (a string)", param="model", code="missing_required")
    max_tokens = _max_tokens(body, limits)
    n = _integer(body, "n", 1, 1, limits.max_n)
    stream = _boolean(body, "stream", False)
    options = body.get("stream_options", {})
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise unsupported("stream_options", "only {'include_usage': bool} is supported")
    tools, tool_choice, named = _tools(body, limits)
    constraint = _constraint(body, limits)
    if tool_choice != "none" and constraint.kind != "text":
        raise ApiError(
            f"tools with tool_choice {tool_choice!r} and {constraint.param} both constrain "
            "the output: use one (or tool_choice 'none')",
            param="tool_choice",
            code="conflicting_constraints",
        )
    return ChatRequest(
        model=body["model"],
        messages=parse_messages(body.get("messages")),
        constraint=constraint,
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0),
        seed=_integer(body, "seed", None, -(2**63), 2**64 - 1),
        n=n if n is not None else 1,
        stream=stream,
        include_usage=bool(options.get("include_usage", False)),
        tools=tools,
        tool_choice=tool_choice,
        named_tool=named,
        parallel_tool_calls=_boolean(body, "parallel_tool_calls", True),
        max_tool_calls=limits.max_tool_calls,
    )


def _refuse_unknown(body: dict[str, Any]) -> None:
    for key, value in body.items():
        if key in HONOURED or key in IGNORED:
            continue
        if key in NEUTRAL:
            if _is_neutral(key, value):
                continue
            raise unsupported(key, f"only {NEUTRAL[key][0]!r} (no effect) is accepted")
        raise unsupported(key, "it is not a field formline knows (not silently ignored)")


def _is_neutral(key: str, value: Any) -> bool:
    if key == "logprobs":
        return value is False
    return not isinstance(value, bool) and value in NEUTRAL[key]


def _max_tokens(body: dict[str, Any], limits: Limits) -> int:
    key = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    value = _integer(body, key, limits.default_max_tokens, 1, None)
    assert value is not None
    if value > limits.max_tokens_cap:
        raise ApiError(
            f"{key} is {value}; this server's cap is {limits.max_tokens_cap}",
            param=key,
            code="max_tokens_too_large",
        )
    return value


def _integer(
    body: dict[str, Any], key: str, default: int | None, low: int, high: int | None
) -> int | None:
    value = body.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(f"{key!r} must be an integer", param=key, code="invalid_type")
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ApiError(f"{key!r} is {value}; it must be {bound}", param=key, code="invalid_value")
    return value


def _number(body: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ApiError(f"{key!r} must be a number", param=key, code="invalid_type")
    if not low <= value <= high:
        raise ApiError(
            f"{key!r} is {value}; it must be between {low} and {high}",
            param=key,
            code="invalid_value",
        )
    return float(value)


def _boolean(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise ApiError(f"{key!r} must be true or false", param=key, code="invalid_type")
    return value


def parse_messages(messages: Any) -> list[dict[str, str]]:
    """Chat messages as ``{"role", "content"}`` strings for the model's chat template:
    text parts joined, an assistant's earlier tool calls written as the JSON formline
    would have produced, ``developer`` as ``system``.

    Raises:
        ApiError: 400 missing or empty, an unknown role, or a non-text content part.
    """
    if not isinstance(messages, list) or not messages:
        raise ApiError("'messages' must be a non-empty list", param="messages", code="invalid_type")
    parsed = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise ApiError(
                f"{where} needs a role among {sorted(ROLES)}", param=where, code="invalid_value"
            )
        content = _content(message.get("content"), f"{where}.content")
        calls = message.get("tool_calls") or []
        if calls:
            content = (content + "\n" if content else "") + _calls_text(calls, where)
        parsed.append({"role": ROLES[message["role"]], "content": content})
    return parsed


def _content(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for index, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise unsupported(f"{where}[{index}]", f"content parts of type {kind!r}")
            texts.append(str(part.get("text", "")))
        return "".join(texts)
    raise ApiError(f"{where} must be a string or a list of parts", param=where, code="invalid_type")


def _calls_text(calls: Any, where: str) -> str:
    written = []
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function", {}) if isinstance(call, dict) else {}
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except (json.JSONDecodeError, TypeError) as error:
            raise ApiError(
                f"{where}.tool_calls: arguments are not JSON", param=f"{where}.tool_calls"
            ) from error
        written.append(json.dumps({"name": function.get("name"), "arguments": arguments}))
    return "\n".join(written)


def _json_value(value: Any, param: str) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as error:
            raise ApiError(f"{param} is not valid JSON: {error}", param=param) from error
    return value


def _schema(value: Any, param: str, limits: Limits) -> dict[str, Any] | bool:
    schema = _json_value(value, param)
    if not isinstance(schema, dict | bool):
        raise ApiError(f"{param} must be a JSON Schema object", param=param, code="invalid_schema")
    size = len(json.dumps(schema))
    if size > limits.max_schema_bytes:
        raise ApiError(
            f"{param} has {size} bytes; the limit is {limits.max_schema_bytes}",
            param=param,
            code="schema_too_large",
        )
    return schema


def _constraint(body: dict[str, Any], limits: Limits) -> Constraint:
    found: list[Constraint] = []
    if "response_format" in body:
        found.append(_response_format(body["response_format"], limits))
    structured = body.get("structured_outputs", {})
    if not isinstance(structured, dict):
        raise ApiError("structured_outputs must be an object", param="structured_outputs")
    for key, value in structured.items():
        if key not in STRUCTURED_KEYS:
            raise unsupported(f"structured_outputs.{key}", f"supported: {list(STRUCTURED_KEYS)}")
        if value is not None and value is not False:
            found.append(_guided(key, value, f"structured_outputs.{key}", limits))
    for key in ("json", "regex", "choice", "grammar"):
        if f"guided_{key}" in body:
            found.append(_guided(key, body[f"guided_{key}"], f"guided_{key}", limits))
    found = [constraint for constraint in found if constraint.kind != "text"]
    if len(found) > 1:
        names = ", ".join(constraint.param for constraint in found)
        raise ApiError(
            f"more than one output constraint: {names}", param=found[1].param,
            code="conflicting_constraints",
        )  # fmt: skip
    return found[0] if found else Constraint()


def _response_format(value: Any, limits: Limits) -> Constraint:
    param = "response_format"
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return Constraint(param=param)
    if kind == "json_object":
        return Constraint("json_object", {"type": "object"}, True, param)
    if kind != "json_schema":
        raise unsupported(f"{param}.type", f"{kind!r}; use text, json_object or json_schema")
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or "schema" not in spec:
        raise ApiError(
            "response_format.json_schema needs a 'schema'",
            param=f"{param}.json_schema.schema",
            code="missing_required",
        )
    extra = set(spec) - {"name", "schema", "strict", "description"}
    if extra:
        raise unsupported(f"{param}.json_schema.{sorted(extra)[0]}", "not a json_schema field")
    param = f"{param}.json_schema.schema"
    strict = bool(spec.get("strict") or False)
    return Constraint("json_schema", _schema(spec["schema"], param, limits), strict, param)


def _guided(key: str, value: Any, param: str, limits: Limits) -> Constraint:
    if key == "json":
        return Constraint("json_schema", _schema(value, param, limits), True, param)
    if key == "json_object":
        return Constraint("json_object", {"type": "object"}, True, param)
    if key == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise ApiError(f"{param} must be a non-empty list of strings", param=param)
        return Constraint("choice", value, True, param)
    if not isinstance(value, str) or not value:
        raise ApiError(f"{param} must be a non-empty string", param=param)
    if len(value.encode()) > limits.max_schema_bytes:
        raise ApiError(f"{param} is over {limits.max_schema_bytes} bytes", param=param)
    return Constraint(key, value, True, param)


def _tools(body: dict[str, Any], limits: Limits) -> tuple[list[Tool], str, str | None]:
    tools = [_tool(entry, f"tools[{i}]", limits) for i, entry in enumerate(body.get("tools", []))]
    choice = body.get("tool_choice", "auto" if tools else "none")
    named = None
    if isinstance(choice, dict):
        function = choice.get("function")
        if choice.get("type") != "function" or not isinstance(function, dict):
            raise unsupported("tool_choice", "use none, auto, required or a named function")
        named, choice = function.get("name"), "named"
        if named not in {tool.name for tool in tools}:
            raise ApiError(f"tool_choice names {named!r}, not in tools", param="tool_choice")
    elif choice not in ("none", "auto", "required"):
        raise unsupported("tool_choice", f"{choice!r}; use none, auto, required or a function")
    if choice != "none" and not tools:
        raise ApiError(f"tool_choice {choice!r} needs tools", param="tool_choice")
    return tools, choice, named


def _tool(entry: Any, param: str, limits: Limits) -> Tool:
    if not isinstance(entry, dict) or entry.get("type") != "function":
        raise unsupported(f"{param}.type", "only function tools are supported")
    function = entry.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ApiError(f"{param}.function needs a name", param=f"{param}.function.name")
    parameters = function.get("parameters")
    if parameters is None:
        parameters = {"type": "object", "properties": {}, "additionalProperties": False}
    schema = _schema(parameters, f"{param}.function.parameters", limits)
    if not isinstance(schema, dict):
        raise ApiError(f"{param}.function.parameters must be an object schema", param=param)
    return Tool(
        function["name"],
        str(function.get("description") or ""),
        schema,
        bool(function.get("strict")),
    )
