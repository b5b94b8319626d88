"""Parse and check a ``POST /v1/chat/completions`` body into a :class:`ChatRequest`.

Every field is either honoured, on an explicit list of fields harmless to ignore, or
accepted only at its neutral value (``presence_penalty: 0``, ``logprobs: false``, ...);
anything else is a 400 naming the field, never silently dropped. A field whose value is
``null`` counts as absent; a field of the wrong type, shape or range is a 400 naming it
(``param``), never a 500. The output constraint comes from exactly one of
``response_format``, vLLM's ``structured_outputs`` / ``guided_*`` fields, or ``tools``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from formline.constraint import Constraint
from formline.pipeline.generate import DEFAULT_WHITESPACE
from formline.server.errors import ApiError, unsupported
from formline.server.messages import load_json, parse_messages

HONOURED = frozenset(
    {
        "model", "messages", "response_format", "structured_outputs", "guided_json",
        "guided_regex", "guided_choice", "guided_grammar", "max_tokens",
        "max_completion_tokens", "temperature", "top_p", "seed", "n", "stream",
        "stream_options", "tools", "tool_choice", "parallel_tool_calls", "formline_think",
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
# Seeds go to numpy's and torch's generators; a non-negative 64-bit integer (OpenAI's and
# vLLM's seed is an int64) leaves room for seed + choice index under torch's 2**64 - 1.
SEED_RANGE = (0, 2**63 - 1)
TOOL_CHOICES = ("none", "auto", "required")
RESPONSE_FORMAT_KEYS = {"text": {"type"}, "json_object": {"type"}}
RESPONSE_FORMAT_KEYS["json_schema"] = {"type", "json_schema"}


@dataclass(frozen=True)
class Limits:
    """What one request may ask for; each is a ``formline serve`` option."""

    max_request_bytes: int = 1_000_000
    max_schema_bytes: int = 100_000
    max_tokens_cap: int = 2048
    default_max_tokens: int = 256
    max_n: int = 8
    request_seconds: float = 300.0  # waiting for the model plus decoding, per request
    compile_seconds: float = 10.0  # one constraint's compile (a 400 past it)
    max_tool_calls: int = 8  # tool calls in one answer (parallel_tool_calls)
    max_think_tokens: int = 256  # formline_think: free tokens before a JSON answer


@dataclass(frozen=True)
class Tool:
    """One function tool: its name, description and parameters schema."""

    name: str
    description: str
    parameters: dict[str, Any]
    strict: bool


@dataclass(frozen=True)
class ApiFields:
    """How one API names the request fields its errors point at: a Responses body has no
    ``messages`` and flat tools, so its errors named fields it does not have
    (``tools[0].function.parameters`` for its ``tools[0].parameters``)."""

    messages: str = "messages"  # what the prompt's conversation comes from
    tool_parameters: str = "tools[{index}].function.parameters"

    def parameters_of(self, index: int) -> str:
        """The field of tool ``index``'s parameters schema."""
        return self.tool_parameters.format(index=index)


CHAT_FIELDS = ApiFields()
RESPONSES_FIELDS = ApiFields(messages="input", tool_parameters="tools[{index}].parameters")


@dataclass
class ChatRequest:
    """A checked chat completion request (``fields``: the API's names for its fields, in
    errors)."""

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
    think: int = 0  # formline_think: free rationale tokens before a JSON answer
    fields: ApiFields = CHAT_FIELDS


def request_too_large(size: str, limits: Limits) -> ApiError:
    """The 413 for a body of ``size`` (``"2000000 bytes"``, ``"more than 1000000 bytes"``),
    naming the limit."""
    return ApiError(
        f"the request has {size}; the limit is {limits.max_request_bytes} bytes "
        "(Limits.max_request_bytes)",
        status=413,
        code="request_too_large",
    )


def parse_body(raw: bytes, limits: Limits) -> dict[str, Any]:
    """The request body as a JSON object, without its ``null`` fields.

    Raises:
        ApiError: 413 over ``max_request_bytes``; 400 not JSON (``NaN``, a number too big
            for a float, nesting deeper than 200 levels included), or not an object.
    Costs one parse and one walk of the body.
    """
    if len(raw) > limits.max_request_bytes:
        raise request_too_large(f"{len(raw)} bytes", limits)
    body = load_json(raw, None)
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object", code="invalid_json")
    return {key: value for key, value in body.items() if value is not None}


def parse_chat_request(body: dict[str, Any], limits: Limits) -> ChatRequest:
    """Check every field of a chat completion body (already without ``null`` values).

    Raises:
        ApiError: 400 for a missing, malformed, conflicting or unsupported field (named in
            ``param``).
    Costs O(size of the body) plus one ``json.dumps`` of each schema (its size limit).
    """
    refuse_unknown(body, HONOURED, IGNORED, NEUTRAL)
    if not isinstance(body.get("model"), str):
        raise ApiError("'model' is required (a string)", param="model", code="missing_required")
    max_tokens = _max_tokens(body, limits)
    n = read_integer(body, "n", 1, 1, limits.max_n)
    stream = read_boolean(body, "stream", False)
    include_usage = read_stream_option(body, stream, "include_usage")
    tools, tool_choice, named = _tools(body, limits)
    constraint = _constraint(body, limits)
    refuse_two_constraints(tool_choice, constraint)
    think = _think(body, limits, constraint)
    return ChatRequest(
        model=body["model"],
        messages=parse_messages(body.get("messages")),
        constraint=constraint,
        max_tokens=max_tokens,
        temperature=read_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=read_number(body, "top_p", 1.0, 0.0, 1.0),
        seed=read_integer(body, "seed", None, *SEED_RANGE),
        n=n if n is not None else 1,
        stream=stream,
        include_usage=include_usage,
        tools=tools,
        tool_choice=tool_choice,
        named_tool=named,
        parallel_tool_calls=read_boolean(body, "parallel_tool_calls", True),
        max_tool_calls=limits.max_tool_calls,
        think=think,
    )


def _think(body: dict[str, Any], limits: Limits, constraint: Constraint) -> int:
    """``formline_think``: tokens of free rationale before a JSON answer (0: none).

    Raises:
        ApiError: 400 for a value outside 0 to ``limits.max_think_tokens``, or thinking
            asked for an answer that is not JSON (text, a regex, a grammar, tools).
    """
    think = read_integer(body, "formline_think", 0, 0, limits.max_think_tokens)
    if think and not constraint.is_json:
        raise ApiError(
            "formline_think needs a JSON answer (response_format json_schema or json_object): "
            "the rationale ends where the JSON starts",
            param="formline_think",
            code="unsupported_parameter",
        )
    return think or 0


def refuse_two_constraints(tool_choice: str, constraint: Constraint) -> None:
    """A 400 when tools (a ``tool_choice`` other than ``none``) and an output format both
    constrain one answer.

    Raises:
        ApiError: 400 (code ``conflicting_constraints``, param ``tool_choice``).
    """
    if tool_choice != "none" and constraint.kind != "text":
        raise ApiError(
            f"tools with tool_choice {tool_choice!r} and {constraint.source} both constrain "
            "the output: use one (or tool_choice 'none')",
            param="tool_choice",
            code="conflicting_constraints",
        )


def refuse_unknown(
    body: dict[str, Any],
    honoured: frozenset[str],
    ignored: frozenset[str],
    neutral: dict[str, tuple[Any, ...]],
) -> None:
    """A 400 for the first field of ``body`` that is neither ``honoured``, ``ignored`` nor
    at its ``neutral`` value (a boolean neutral value matches only a boolean)."""
    for key, value in body.items():
        if key in honoured or key in ignored:
            continue
        if key in neutral:
            if _is_neutral(value, neutral[key]):
                continue
            raise unsupported(key, f"only {neutral[key][0]!r} (no effect) is accepted")
        raise unsupported(key, "it is not a field formline knows (not silently ignored)")


def _is_neutral(value: Any, accepted: tuple[Any, ...]) -> bool:
    if isinstance(value, bool) or any(isinstance(option, bool) for option in accepted):
        return any(value is option for option in accepted)
    return value in accepted


def read_stream_option(body: dict[str, Any], stream: bool, option: str) -> bool:
    """``stream_options.<option>``, the one option the API has here (only with
    ``stream: true``, as OpenAI says); false when absent.

    Raises:
        ApiError: 400 for another option, a value that is not a boolean, or no stream.
    """
    if "stream_options" not in body:
        return False
    options = body["stream_options"]
    if not isinstance(options, dict) or set(options) - {option}:
        raise unsupported("stream_options", f"only {{{option!r}: bool}} is supported")
    if not stream:
        raise ApiError(
            "stream_options needs stream: true", param="stream_options", code="invalid_value"
        )
    return read_boolean(options, option, False, f"stream_options.{option}")


def _max_tokens(body: dict[str, Any], limits: Limits) -> int:
    key = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    value = read_integer(body, key, limits.default_max_tokens, 1, None)
    assert value is not None
    if key == "max_completion_tokens" and body.get("max_tokens", value) != value:
        raise ApiError(
            "max_tokens and max_completion_tokens differ: send one",
            param="max_tokens", code="conflicting_parameters",
        )  # fmt: skip
    if value > limits.max_tokens_cap:
        raise ApiError(
            f"{key} is {value}; this server's cap is {limits.max_tokens_cap}",
            param=key,
            code="max_tokens_too_large",
        )
    return value


def read_integer(
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


def read_number(body: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
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


def read_optional_boolean(value: Any, param: str) -> bool | None:
    """``value`` when it is a boolean or absent (``None``); else a 400 naming ``param``."""
    if value is not None and not isinstance(value, bool):
        raise ApiError(f"{param} must be true or false", param=param, code="invalid_type")
    return value


def read_boolean(body: dict[str, Any], key: str, default: bool, param: str | None = None) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        where = param or key
        raise ApiError(f"{where!r} must be true or false", param=where, code="invalid_type")
    return value


def read_string(value: Any, param: str, allow_empty: bool = True) -> str:
    if not isinstance(value, str) or (not value and not allow_empty):
        kind = "a string" if allow_empty else "a non-empty string"
        raise ApiError(f"{param} must be {kind}", param=param, code="invalid_type")
    return value


def read_schema(value: Any, param: str, limits: Limits) -> dict[str, Any] | bool:
    schema = load_json(value, param) if isinstance(value, str) else value
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
        raise ApiError(
            "structured_outputs must be an object", param="structured_outputs",
            code="invalid_type",
        )  # fmt: skip
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
        names = ", ".join(constraint.source for constraint in found)
        raise ApiError(
            f"more than one output constraint: {names}", param=found[1].source,
            code="conflicting_constraints",
        )  # fmt: skip
    return found[0] if found else Constraint()


def read_format_type(value: Any, param: str, keys: dict[str, set[str]]) -> str:
    """The ``type`` of an output format object at ``param``: one of ``keys``, whose value
    is the set of fields that type may have.

    Raises:
        ApiError: 400 for a value that is not an object, an unknown type, another field.
    """
    if not isinstance(value, dict):
        raise ApiError(f"{param} must be an object", param=param, code="invalid_type")
    kind = value.get("type")
    if not isinstance(kind, str) or kind not in keys:
        raise unsupported(f"{param}.type", f"{kind!r}; use text, json_object or json_schema")
    extra = set(value) - keys[kind]
    if extra:
        raise unsupported(f"{param}.{sorted(extra)[0]}", f"not a field of type {kind!r}")
    return kind


def _response_format(value: Any, limits: Limits) -> Constraint:
    param = "response_format"
    kind = read_format_type(value, param, RESPONSE_FORMAT_KEYS)
    if kind == "text":
        return Constraint(source=param)
    if kind == "json_object":
        return json_constraint("json_object", None, True, param)
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise ApiError(
            "response_format.json_schema needs a 'schema'",
            param=f"{param}.json_schema.schema",
            code="missing_required",
        )
    return read_json_schema_format(spec, f"{param}.json_schema", set(), limits)


def read_json_schema_format(
    spec: dict[str, Any], param: str, others: set[str], limits: Limits
) -> Constraint:
    """A ``json_schema`` format (``name``, ``schema``, ``strict``, ``description``, plus
    ``others`` allowed beside them) as a constraint; ``param`` names ``spec`` in errors.

    Raises:
        ApiError: 400 for a missing schema, an unknown field or a field of the wrong type.
    """
    if "schema" not in spec:
        raise ApiError(
            f"{param} needs a 'schema'", param=f"{param}.schema", code="missing_required"
        )
    extra = set(spec) - {"name", "schema", "strict", "description"} - others
    if extra:
        raise unsupported(f"{param}.{sorted(extra)[0]}", "not a json_schema field")
    for key in ("name", "description"):
        if spec.get(key) is not None:
            read_string(spec[key], f"{param}.{key}")
    strict = read_optional_boolean(spec.get("strict"), f"{param}.strict")
    where = f"{param}.schema"
    return json_constraint(
        "json_schema", read_schema(spec["schema"], where, limits), bool(strict), where
    )


def json_constraint(kind: str, schema: Any, strict: bool, param: str) -> Constraint:
    """A JSON constraint as the server compiles it: open objects closed where that narrows
    (vLLM's xgrammar default, :mod:`formline.schema.closing`), whitespace as
    :data:`~formline.pipeline.generate.DEFAULT_WHITESPACE` allows (xgrammar and llguidance
    allow any by default; formline bounds it so a model cannot loop on newlines);
    ``strict`` false checks an unsupported keyword after decoding."""
    return Constraint(
        kind, schema, strict, whitespace=DEFAULT_WHITESPACE, close_objects=True, source=param
    )


def _guided(key: str, value: Any, param: str, limits: Limits) -> Constraint:
    if key == "json":
        return json_constraint("json_schema", read_schema(value, param, limits), True, param)
    if key == "json_object":
        if value is not True:
            raise ApiError(f"{param} must be true", param=param, code="invalid_type")
        return json_constraint("json_object", None, True, param)
    if key == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise ApiError(
                f"{param} must be a non-empty list of strings", param=param, code="invalid_type"
            )
        size = sum(len(option.encode(errors="surrogatepass")) for option in value)
    else:
        size = len(read_string(value, param, allow_empty=False).encode(errors="surrogatepass"))
    # A lone surrogate ("\ud800" in the JSON) is counted here and refused by the grammar's
    # parser (a 400 naming it); encoded strictly, it was a 500.
    if size > limits.max_schema_bytes:
        raise ApiError(
            f"{param} has {size} bytes; the limit is {limits.max_schema_bytes}",
            param=param, code="schema_too_large",
        )  # fmt: skip
    return Constraint(key, value, source=param)


def _tools(body: dict[str, Any], limits: Limits) -> tuple[list[Tool], str, str | None]:
    entries = body.get("tools", [])
    if not isinstance(entries, list):
        raise ApiError("tools must be a list", param="tools", code="invalid_type")
    tools = [_tool(entry, f"tools[{index}]", limits) for index, entry in enumerate(entries)]
    refuse_duplicate_names(tools)
    return (tools, *read_tool_choice(body, tools, _named_tool))


def read_tool_choice(
    body: dict[str, Any],
    tools: list[Tool],
    read_named: Callable[[dict[str, Any], list[Tool]], str],
) -> tuple[str, str | None]:
    """``tool_choice`` (``auto`` with tools, else ``none``, when absent) and the tool it
    names; ``read_named`` reads an object choice (the two APIs spell it differently).

    Raises:
        ApiError: 400 for an unknown choice, or a choice other than ``none`` without tools.
    """
    choice = body.get("tool_choice", "auto" if tools else "none")
    named = None
    if isinstance(choice, dict):
        named, choice = read_named(choice, tools), "named"
    elif not isinstance(choice, str) or choice not in TOOL_CHOICES:
        raise unsupported("tool_choice", f"{choice!r}; use none, auto, required or a function")
    if choice != "none" and not tools:
        raise ApiError(
            f"tool_choice {choice!r} needs tools", param="tool_choice", code="invalid_value"
        )
    return choice, named


def _named_tool(choice: dict[str, Any], tools: list[Tool]) -> str:
    function = choice.get("function")
    if choice.get("type") != "function" or not isinstance(function, dict):
        raise unsupported("tool_choice", "use none, auto, required or a named function")
    return check_tool_named(function.get("name"), tools, "tool_choice.function.name")


def check_tool_named(name: Any, tools: list[Tool], param: str) -> str:
    """``name``, when it is a string naming one of ``tools``; else a 400 naming ``param``."""
    name = read_string(name, param)
    if name not in {tool.name for tool in tools}:
        raise ApiError(
            f"tool_choice names {name!r}, not in tools", param=param, code="invalid_value"
        )
    return name


def refuse_duplicate_names(tools: list[Tool], name_field: str = "function.name") -> None:
    """A 400 naming ``tools[i].<name_field>`` when two tools share a name.

    Raises:
        ApiError: 400 (code ``duplicate_tool_name``).
    """
    first: dict[str, int] = {}
    for index, tool in enumerate(tools):
        if tool.name in first:
            raise ApiError(
                f"tools[{first[tool.name]}] and tools[{index}] are both named {tool.name!r}: "
                "a call could not say which one it means",
                param=f"tools[{index}].{name_field}",
                code="duplicate_tool_name",
            )
        first[tool.name] = index


def _tool(entry: Any, param: str, limits: Limits) -> Tool:
    if not isinstance(entry, dict) or entry.get("type") != "function":
        raise unsupported(f"{param}.type", "only function tools are supported")
    function = entry.get("function")
    if not isinstance(function, dict):
        raise ApiError(
            f"{param}.function must be an object", param=f"{param}.function", code="invalid_type"
        )
    return read_function(function, f"{param}.function", False, limits)


def read_function(function: dict[str, Any], param: str, strict: bool, limits: Limits) -> Tool:
    """A function's ``name``, ``description``, ``parameters`` and ``strict`` (``strict`` when
    absent) as a :class:`Tool`; ``param`` names ``function`` in errors.

    Raises:
        ApiError: 400 for a missing name, a field of the wrong type, a schema that is not an
            object or is over ``limits.max_schema_bytes``.
    """
    name = read_string(function.get("name"), f"{param}.name", allow_empty=False)
    description = function.get("description")
    if description is not None:
        read_string(description, f"{param}.description")
    given = read_optional_boolean(function.get("strict"), f"{param}.strict")
    parameters = function.get("parameters")
    if parameters is None:
        parameters = {"type": "object", "properties": {}, "additionalProperties": False}
    where = f"{param}.parameters"
    schema = read_schema(parameters, where, limits)
    if not isinstance(schema, dict):
        raise ApiError(f"{where} must be an object schema", param=where, code="invalid_schema")
    return Tool(name, description or "", schema, strict if given is None else given)
