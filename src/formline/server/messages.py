"""The ``messages`` of a chat completion body, checked and flattened for a chat template.

Every message is an object with a ``role`` among :data:`ROLES` and no key its role does not
take (:data:`MESSAGE_KEYS`); its ``content`` is a string or a list of text parts (``null``
or absent only in an assistant's message with ``tool_calls``); an assistant's earlier
``tool_calls`` are written back as the JSON formline would have produced for them. Anything
else is a 400 naming the field (``messages[2].tool_calls[0].function.arguments``), never a
500.
"""

from __future__ import annotations

import json
import re
from typing import Any

from formline.server.errors import ApiError, unsupported

ROLES = {"system": "system", "developer": "system", "user": "user"}
ROLES.update({"assistant": "assistant", "tool": "tool"})
# The keys a message of each role may carry: read (role, content, tool_calls) or harmless
# to leave out of the prompt (name: who speaks; tool_call_id: the call a result answers,
# which the chat's order says; reasoning_content: the rationale of this server's own earlier
# answer, echoed back, which was never part of the answer). Any other key was dropped
# unread: {"role": "user", "contnet": "Hi"} answered an empty turn. OpenAI's own fields of
# an earlier assistant answer pass (refusal, audio, annotations, the legacy function_call):
# the openai client sends them back with the answer it got (annotations: []); a refusal
# stands for an absent content. tool_calls is read on every role (an empty list passes; a
# call on another role than the assistant's is refused by name).
_SPEAKER_KEYS = frozenset({"role", "content", "name", "tool_calls"})
ASSISTANT_ANSWER_KEYS = frozenset(
    {"reasoning_content", "refusal", "audio", "annotations", "function_call"}
)
MESSAGE_KEYS: dict[str, frozenset[str]] = {
    "system": _SPEAKER_KEYS,
    "developer": _SPEAKER_KEYS,
    "user": _SPEAKER_KEYS,
    "assistant": _SPEAKER_KEYS | ASSISTANT_ANSWER_KEYS,
    "tool": _SPEAKER_KEYS | {"tool_call_id"},
}
MAX_NESTING = 200  # JSON levels in a request body (and in the JSON texts inside it)


def parse_messages(messages: Any) -> list[dict[str, str]]:
    """Chat messages as ``{"role", "content"}`` strings for the model's chat template:
    text parts joined, an assistant's earlier tool calls written as the JSON formline
    would have produced, ``developer`` as ``system``.

    Raises:
        ApiError: 400 missing or empty, a message that is not an object, an unknown role,
            a field of the wrong type, a non-text content part, malformed tool calls.
    Costs O(size of the messages) plus one JSON parse of each earlier call's arguments.
    """
    if not isinstance(messages, list) or not messages:
        raise ApiError("'messages' must be a non-empty list", param="messages", code="invalid_type")
    return [parse_message(message, f"messages[{index}]") for index, message in enumerate(messages)]


def parse_message(
    message: Any, where: str, keys: dict[str, frozenset[str]] = MESSAGE_KEYS
) -> dict[str, str]:
    """One message (at ``where`` in the request) as ``{"role", "content"}`` strings;
    ``keys``: the roles allowed and the keys a message of each may carry (a key whose value
    is ``null`` counts as absent, as in the body).

    Raises:
        ApiError: 400 naming the field at fault (see :func:`parse_messages`), an unknown key
            (``unsupported_parameter``), or a missing content (an assistant's may be left out
            for its ``tool_calls``).
    """
    if not isinstance(message, dict):
        raise ApiError(f"{where} must be an object", param=where, code="invalid_type")
    role = message.get("role")
    if not isinstance(role, str) or role not in keys:
        raise ApiError(
            f"{where}.role must be one of {sorted(keys)}", param=f"{where}.role",
            code="invalid_value",
        )  # fmt: skip
    refuse_unread(message, keys[role], where, f"a field of {role} messages")
    for key in ("name", "tool_call_id", "reasoning_content", "refusal"):
        if message.get(key) is not None and not isinstance(message[key], str):
            raise ApiError(
                f"{where}.{key} must be a string", param=f"{where}.{key}", code="invalid_type"
            )
    # An assistant's answer may hold calls, a legacy function_call or a refusal instead.
    answered = any(message.get(key) for key in ("tool_calls", "function_call", "refusal"))
    if message.get("content") is None and (role != "assistant" or not answered):
        raise ApiError(
            f"{where}.content is required" + ("" if role != "assistant" else " without tool_calls"),
            param=f"{where}.content", code="missing_required",
        )  # fmt: skip
    content = parse_content(message.get("content"), f"{where}.content")
    if not content and role == "assistant" and message.get("refusal"):
        content = message["refusal"]  # what the model said instead
    calls = _tool_calls(message.get("tool_calls"), role, f"{where}.tool_calls")
    if calls:
        content = (content + "\n" if content else "") + calls
    return {"role": ROLES[role], "content": content}


def refuse_unread(item: dict[str, Any], keys: frozenset[str], where: str, why: str) -> None:
    """A 400 for the first key of ``item`` (not ``null``) outside ``keys``, which nothing
    would read: ``why`` says what ``keys`` are.

    Raises:
        ApiError: 400 (``unsupported_parameter``) naming ``where.<key>``.
    """
    unread = sorted(key for key, value in item.items() if key not in keys and value is not None)
    if unread:
        raise unsupported(f"{where}.{unread[0]}", f"not {why} ({', '.join(sorted(keys))})")


def _tool_calls(calls: Any, role: str, where: str) -> str:
    """An assistant message's earlier ``tool_calls`` as text (``""``: none)."""
    if calls is None:
        return ""
    if not isinstance(calls, list):
        raise ApiError(f"{where} must be a list", param=where, code="invalid_type")
    if calls and role != "assistant":
        raise ApiError(
            f"{where}: only an assistant message carries tool_calls", param=where,
            code="invalid_value",
        )  # fmt: skip
    return _calls_text(calls, where)


def parse_content(content: Any, where: str) -> str:
    """A message's content (a string, ``null`` or a list of text parts) as one string.

    Raises:
        ApiError: 400 naming ``where`` (or the part at fault).
    """
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise ApiError(
            f"{where} must be a string or a list of parts", param=where, code="invalid_type"
        )
    texts = []
    for index, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise unsupported(f"{where}[{index}]", f"content parts of type {kind!r}")
        text = part.get("text")
        if not isinstance(text, str):
            raise ApiError(
                f"{where}[{index}].text must be a string", param=f"{where}[{index}].text",
                code="invalid_type",
            )  # fmt: skip
        texts.append(text)
    return "".join(texts)


def _calls_text(calls: list[Any], where: str) -> str:
    """The earlier calls as formline writes them: ``{"name", "arguments"}`` per line."""
    written = []
    for index, call in enumerate(calls):
        at = f"{where}[{index}]"
        if not isinstance(call, dict):
            raise ApiError(f"{at} must be an object", param=at, code="invalid_type")
        if call.get("type", "function") != "function":
            raise unsupported(f"{at}.type", "only function calls are supported")
        function = call.get("function")
        if not isinstance(function, dict):
            raise ApiError(
                f"{at}.function must be an object", param=f"{at}.function", code="invalid_type"
            )
        written.append(
            call_text(
                function.get("name"), function.get("arguments"), f"{at}.function.name",
                f"{at}.function.arguments",
            )
        )  # fmt: skip
    return "\n".join(written)


def call_text(name: Any, arguments: Any, name_at: str, arguments_at: str) -> str:
    """An earlier call as formline writes it, ``{"name", "arguments"}`` in one line of JSON;
    ``name_at`` and ``arguments_at`` name the two fields in errors.

    Raises:
        ApiError: 400 for a name that is not a non-empty string, or arguments that are not
            a string of JSON.
    """
    if not isinstance(name, str) or not name:
        raise ApiError(f"{name_at} must be a non-empty string", param=name_at, code="invalid_type")
    if arguments is not None and not isinstance(arguments, str):
        raise ApiError(
            f"{arguments_at} must be a string of JSON", param=arguments_at, code="invalid_type"
        )
    value = load_json(arguments or "{}", arguments_at)
    return json.dumps({"name": name, "arguments": value}, ensure_ascii=False)


def load_json(text: str | bytes, param: str | None) -> Any:
    """``text`` parsed as strict JSON: no ``NaN`` / ``Infinity``, no number too big for a
    float, at most :data:`MAX_NESTING` levels.

    Raises:
        ApiError: 400 (code ``invalid_json``) naming ``param``.
    Costs one parse plus one walk of the value.
    """
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError as error:
        raise _not_json(param, f"nested deeper than {MAX_NESTING} levels") from error
    except (ValueError, UnicodeDecodeError) as error:  # JSONDecodeError, digit limits, NaN
        raise _not_json(param, str(error)) from error
    if nesting_over(value, MAX_NESTING):
        raise _not_json(param, f"nested deeper than {MAX_NESTING} levels")
    if _SURROGATE_ESCAPE.search(
        text if isinstance(text, bytes) else text.encode("utf-8", "replace")
    ):
        where = _lone_surrogate_at(value, param or "")
        if where is not None:  # no UTF-8 text holds one: it reached the prompt's encode, a 500
            raise ApiError(
                f"{where or 'the request body'} holds a lone surrogate (a \\uD800-\\uDFFF "
                "escape without its pair), which is not text",
                param=where or param,
                code="invalid_json",
            )
    return value


# A \u escape of a surrogate (D800-DFFF): only then can a parsed string hold a lone one.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _lone_surrogate_at(value: Any, root: str) -> str | None:
    """The path (``messages[0].content``) of the first string, key or value, of ``value``
    that holds a lone surrogate, else ``None``. Costs one iterative walk."""
    pending = [(value, root)]
    while pending:
        node, path = pending.pop()
        if isinstance(node, str):
            if _LONE_SURROGATE.search(node):
                return path
        elif isinstance(node, dict):
            for key, child in node.items():
                shown = key.encode("utf-8", "backslashreplace").decode()  # the path is text
                inner = f"{path}.{shown}" if path else shown
                if _LONE_SURROGATE.search(key):
                    return inner
                pending.append((child, inner))
        elif isinstance(node, list):
            pending.extend((child, f"{path}[{index}]") for index, child in enumerate(node))
    return None


def _not_json(param: str | None, why: str) -> ApiError:
    where = "the request body" if param is None else param
    return ApiError(f"{where} is not valid JSON: {why}", param=param, code="invalid_json")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"the number {text[:40]} is too large")
    return value


def nesting_over(value: Any, limit: int) -> bool:
    """Whether ``value`` (parsed JSON) nests deeper than ``limit`` levels. Costs one
    iterative walk (no recursion: a deep value would overflow the stack)."""
    pending = [(value, 0)]
    while pending:
        node, depth = pending.pop()
        if depth > limit:
            return True
        if isinstance(node, dict):
            pending.extend((child, depth + 1) for child in node.values())
        elif isinstance(node, list):
            pending.extend((child, depth + 1) for child in node)
    return False
