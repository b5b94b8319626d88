"""Parse and check a ``POST /v1/responses`` body (OpenAI's Responses API) into a request.

The same rules as Chat Completions (:mod:`.requests`): a field is honoured, harmless to
ignore, or accepted only at its neutral value; anything else is a 400 naming it. The body
maps onto the same :class:`~formline.server.requests.ChatRequest` (one constraint, one
decoding loop): ``input`` and ``instructions`` become the messages, ``text.format`` the
constraint (``text``, ``json_object``, ``json_schema``), ``tools`` and ``tool_choice`` the
tool plan, ``max_output_tokens`` the budget. What the answer echoes back (the tools, the
format, the metadata) is kept in :attr:`ResponsesRequest.echo`.

Not supported (a 400): ``previous_response_id`` and ``conversation`` (formline stores no
response, hence ``store`` is answered ``false``), ``prompt`` templates, ``reasoning``,
hosted tools, and input parts other than text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from formline.constraint import Constraint
from formline.server.errors import ApiError, unsupported
from formline.server.messages import call_text, parse_content, parse_message, refuse_unread
from formline.server.requests import (
    RESPONSES_FIELDS,
    ChatRequest,
    Limits,
    Tool,
    check_tool_named,
    json_constraint,
    read_boolean,
    read_format_type,
    read_function,
    read_integer,
    read_json_schema_format,
    read_number,
    read_stream_option,
    read_string,
    read_tool_choice,
    refuse_duplicate_names,
    refuse_two_constraints,
    refuse_unknown,
)

HONOURED = frozenset(
    {
        "model", "input", "instructions", "text", "tools", "tool_choice",
        "parallel_tool_calls", "max_output_tokens", "max_tool_calls", "temperature", "top_p",
        "stream", "stream_options", "metadata", "store",
    }
)  # fmt: skip
# Bookkeeping and routing hints that change no token (``store`` is answered ``false``).
IGNORED = frozenset({"user", "service_tier", "prompt_cache_key", "safety_identifier"})
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "truncation": ("disabled",),
    "include": ([],),
    "background": (False,),
    "top_logprobs": (0,),
}
# Refused with the reason: what formline does not do rather than does not know.
REFUSED = {
    "previous_response_id": "formline stores no response: send the conversation in input",
    "conversation": "formline stores no conversation: send it in input",
    "prompt": "formline has no stored prompt templates: send instructions and input",
    "reasoning": "SmolLM2 and formline's engines have no reasoning effort or summaries",
}
FORMAT_KEYS = {"text": {"type"}, "json_object": {"type"}}
FORMAT_KEYS["json_schema"] = {"type", "name", "schema", "strict", "description"}
TEXT_PART_TYPES = ("input_text", "output_text", "text")
# The keys of each input item: read, or bookkeeping of an earlier response (id, status;
# call_id: the call an output answers, which the items' order says). Any other key was
# dropped unread: {"role": "user", "text": "hi"} answered an empty turn.
_BOOKKEEPING = frozenset({"type", "id", "status"})
ITEM_KEYS = {
    "function_call": _BOOKKEEPING | {"name", "arguments", "call_id"},
    "function_call_output": _BOOKKEEPING | {"output", "call_id"},
}
# A message item's roles (no "tool": a call's result is a function_call_output item).
_MESSAGE_KEYS = frozenset({"role", "content"})
MESSAGE_KEYS = {role: _MESSAGE_KEYS for role in ("system", "developer", "user", "assistant")}


@dataclass
class ResponsesRequest:
    """A checked Responses request: what to decode (:attr:`chat`) and what the answer
    echoes back (:attr:`echo`: instructions, text format, tools, tool choice, metadata,
    sampling fields, as OpenAI's ``Response`` object carries them)."""

    chat: ChatRequest
    echo: dict[str, Any] = field(default_factory=dict)


def parse_responses_request(body: dict[str, Any], limits: Limits) -> ResponsesRequest:
    """Check every field of a Responses body (already without ``null`` values).

    Raises:
        ApiError: 400 for a missing, malformed, conflicting or unsupported field (named in
            ``param``), e.g. ``input[2].content[0]`` for an image part.
    Costs O(size of the body) plus one ``json.dumps`` of each schema (its size limit).
    """
    for key, why in REFUSED.items():
        if key in body:
            raise unsupported(key, why)
    refuse_unknown(body, HONOURED, IGNORED, NEUTRAL)
    if not isinstance(body.get("model"), str):
        raise ApiError("'model' is required (a string)", param="model", code="missing_required")
    stream = read_boolean(body, "stream", False)
    # Obfuscation pads events against side channels; formline sends no padding either way.
    read_stream_option(body, stream, "include_obfuscation")
    max_tokens = _max_output_tokens(body, limits)
    constraint, text_echo = _text_format(body.get("text", {}), limits)
    tools, tool_choice, named = _tools(body, limits)
    refuse_two_constraints(tool_choice, constraint)
    max_calls = read_integer(body, "max_tool_calls", limits.max_tool_calls, 1, None)
    assert max_calls is not None
    chat = ChatRequest(
        model=body["model"],
        messages=_messages(body),
        constraint=constraint,
        max_tokens=max_tokens,
        temperature=read_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=read_number(body, "top_p", 1.0, 0.0, 1.0),
        stream=stream,
        tools=tools,
        tool_choice=tool_choice,
        named_tool=named,
        parallel_tool_calls=read_boolean(body, "parallel_tool_calls", True),
        max_tool_calls=min(max_calls, limits.max_tool_calls),
        fields=RESPONSES_FIELDS,
    )
    return ResponsesRequest(chat, _echo(body, chat, text_echo))


def _echo(body: dict[str, Any], chat: ChatRequest, text: dict[str, Any]) -> dict[str, Any]:
    """The request fields a ``Response`` object repeats, as they were honoured."""
    metadata = body.get("metadata", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ApiError(
            "metadata must be an object of strings", param="metadata", code="invalid_type"
        )
    tool_choice: Any = chat.tool_choice
    if chat.tool_choice == "named":
        tool_choice = {"type": "function", "name": chat.named_tool}
    return {
        "instructions": body.get("instructions"),
        "metadata": metadata,
        "text": text,
        "tools": [_tool_echo(tool) for tool in chat.tools],
        "tool_choice": tool_choice,
        "parallel_tool_calls": chat.parallel_tool_calls,
        "max_output_tokens": body.get("max_output_tokens"),
        "max_tool_calls": body.get("max_tool_calls"),
        "temperature": chat.temperature,
        "top_p": chat.top_p,
        "user": body.get("user"),
    }


def _tool_echo(tool: Tool) -> dict[str, Any]:
    return {
        "type": "function",
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.parameters,
        "strict": tool.strict,
    }


def _max_output_tokens(body: dict[str, Any], limits: Limits) -> int:
    value = read_integer(body, "max_output_tokens", limits.default_max_tokens, 1, None)
    assert value is not None
    if value > limits.max_tokens_cap:
        raise ApiError(
            f"max_output_tokens is {value}; this server's cap is {limits.max_tokens_cap}",
            param="max_output_tokens",
            code="max_tokens_too_large",
        )
    return value


def _text_format(text: Any, limits: Limits) -> tuple[Constraint, dict[str, Any]]:
    """``text.format`` as a constraint, and the ``text`` object the answer echoes."""
    if not isinstance(text, dict):
        raise ApiError("text must be an object", param="text", code="invalid_type")
    extra = set(text) - {"format", "verbosity"}
    if extra:
        raise unsupported(f"text.{sorted(extra)[0]}", "not a field of text")
    if text.get("verbosity", "medium") != "medium":
        raise unsupported("text.verbosity", "only 'medium' (no effect) is accepted")
    spec = text.get("format", {"type": "text"})
    param = "text.format"
    kind = read_format_type(spec, param, FORMAT_KEYS)
    echo = {"format": spec, "verbosity": "medium"}
    if kind == "text":
        return Constraint(source=param), echo
    if kind == "json_object":
        return json_constraint("json_object", None, True, param), echo
    constraint = read_json_schema_format(spec, param, {"type"}, limits)
    return constraint, {**echo, "format": {**spec, "strict": constraint.strict}}


def _tools(body: dict[str, Any], limits: Limits) -> tuple[list[Tool], str, str | None]:
    entries = body.get("tools", [])
    if not isinstance(entries, list):
        raise ApiError("tools must be a list", param="tools", code="invalid_type")
    tools = []
    for index, entry in enumerate(entries):
        param = f"tools[{index}]"
        if not isinstance(entry, dict) or entry.get("type") != "function":
            raise unsupported(f"{param}.type", "only function tools are supported")
        extra = set(entry) - {"type", "name", "description", "parameters", "strict"}
        if extra:
            raise unsupported(f"{param}.{sorted(extra)[0]}", "not a function tool field")
        # The Responses API's function tools are strict unless they say otherwise.
        tools.append(read_function(entry, param, True, limits))
    refuse_duplicate_names(tools, "name")
    return (tools, *read_tool_choice(body, tools, _named_tool))


def _named_tool(choice: dict[str, Any], tools: list[Tool]) -> str:
    if choice.get("type") != "function" or set(choice) != {"type", "name"}:
        raise unsupported("tool_choice", "use none, auto, required or {type: function, name}")
    return check_tool_named(choice.get("name"), tools, "tool_choice.name")


def _messages(body: dict[str, Any]) -> list[dict[str, str]]:
    """``instructions`` (a system message) and ``input`` as chat messages: a string is one
    user message; consecutive ``function_call`` items are one assistant turn."""
    messages = []
    if "instructions" in body:
        instructions = read_string(body["instructions"], "instructions")
        messages.append({"role": "system", "content": instructions})
    given = body.get("input")
    if isinstance(given, str):
        return [*messages, {"role": "user", "content": given}]
    if not isinstance(given, list) or not given:
        raise ApiError(
            "'input' must be a string or a non-empty list of items", param="input",
            code="invalid_type",
        )  # fmt: skip
    after_call = False  # the previous item was a function_call: the same assistant turn
    for index, item in enumerate(given):
        message = _item(item, f"input[{index}]")
        is_call = item.get("type") == "function_call"
        if is_call and after_call:
            messages[-1]["content"] += "\n" + message["content"]
        else:
            messages.append(message)
        after_call = is_call
    return messages


def _item(item: Any, where: str) -> dict[str, str]:
    """One ``input`` item (at ``where``) as a chat message.

    Raises:
        ApiError: 400 naming the field at fault: an unknown type or key, a missing content
            or output, a malformed call.
    """
    if not isinstance(item, dict):
        raise ApiError(f"{where} must be an object", param=where, code="invalid_type")
    kind = item.get("type", "message")
    if kind == "message":
        message = {key: value for key, value in item.items() if key not in _BOOKKEEPING}
        if isinstance(message.get("content"), list):
            message["content"] = [_text_part(part) for part in message["content"]]
        return parse_message(message, where, MESSAGE_KEYS)
    if kind not in ITEM_KEYS:
        raise unsupported(
            f"{where}.type", f"{kind!r}; use message, function_call or function_call_output"
        )
    refuse_unread(item, ITEM_KEYS[kind], where, f"a field of {kind} items")
    if kind == "function_call":
        text = call_text(
            item.get("name"), item.get("arguments"), f"{where}.name", f"{where}.arguments"
        )
        return {"role": "assistant", "content": text}
    output = item.get("output")
    if output is None:
        raise ApiError(
            f"{where}.output is required", param=f"{where}.output", code="missing_required"
        )
    if isinstance(output, list):
        output = [_text_part(part) for part in output]
    return {"role": "tool", "content": parse_content(output, f"{where}.output")}


def _text_part(part: Any) -> Any:
    """A Responses text part (``input_text``, ``output_text``) in the chat shape; any other
    part is left as it is, so the message check names it."""
    if isinstance(part, dict) and part.get("type") in TEXT_PART_TYPES:
        return {**part, "type": "text"}
    return part
