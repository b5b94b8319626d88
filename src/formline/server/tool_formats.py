"""Tool calls in the model's own syntax: which one a model uses, its grammar, and its reading.

A chat template that defines a tool-call syntax trained the model on it, so a call in that
syntax is the one the model is most likely to write well. Four formats:

* ``hermes`` (Qwen 2/2.5/3, Hermes and the templates that copy them): text, then
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, one tag per call.
* ``smollm2`` (the function-calling prompt of SmolLM2's model card; its template has no
  tool syntax, so only ``--tool-format smollm2`` chooses it): text, then one
  ``<tool_call>[{"name": ..., "arguments": {...}}, ...]</tool_call>`` holding every call.
* ``llama3`` (Llama 3.1-3.3's JSON tool calling): the whole answer is
  ``{"name": ..., "parameters": {...}}``, one call.
* ``json`` (the fallback for templates without a syntax): formline's own wrapper, a
  ``{"name", "arguments"}`` object or an array of them, as :mod:`.constraints` builds it.

With a tagged format (``hermes``, ``smollm2``) ``tool_choice: "auto"`` lets the model write
text freely and constrains only inside the tag (:func:`formline.grammar.tags.tagged_grammar`),
``required`` starts the answer with the tag; a named tool is answered with its arguments
alone, in every format. The format is detected once per server from the chat template
(:func:`detect_tool_format`) or given with ``formline serve --tool-format``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

TOOL_FORMAT_NAMES = ("hermes", "smollm2", "llama3", "json")
_WHITESPACE = re.compile(r"\s*")


@dataclass(frozen=True)
class ToolFormat:
    """How one family of chat templates writes tool calls.

    ``trigger``: the bytes that open a call in free text (``None``: the call is the whole
    answer, as JSON); ``opening``/``closing``: a tag's ends; ``list_body``: one tag holds a
    JSON array of every call; ``arguments_key``: the call object's key for the arguments.
    """

    name: str
    trigger: bytes | None
    opening: bytes = b""
    closing: bytes = b""
    list_body: bool = False
    arguments_key: str = "arguments"
    parallel: bool = True

    @property
    def is_tagged(self) -> bool:
        """Whether calls sit in tags after free text (the model may write text first)."""
        return self.trigger is not None


FORMATS = {
    "hermes": ToolFormat("hermes", b"<tool_call>", b"<tool_call>\n", b"\n</tool_call>"),
    "smollm2": ToolFormat(
        "smollm2", b"<tool_call>", b"<tool_call>", b"</tool_call>", list_body=True
    ),
    "llama3": ToolFormat("llama3", None, arguments_key="parameters", parallel=False),
    "json": ToolFormat("json", None),
}


def detect_tool_format(template: str | None) -> ToolFormat:
    """The format a chat template defines: ``<tool_call>`` in it means ``hermes``, Llama 3's
    ``<|python_tag|>`` or ``ipython`` role ``llama3``; a template without one (the embedded
    SmolLM2-135M's) falls back to ``json``. Costs two substring searches.

    Why ``json`` for the embedded model, measured (7 weather/time requests, greedy,
    ``tool_choice: "required"``; 8 under ``auto``): the 135M model picks the same tool with
    the same arguments in all four formats (4/7 right; under ``auto`` it never calls a tool,
    and answers the 3 tool-free prompts in text, in every format), and ``json`` is the
    fastest (13.3 s for the 7, ``smollm2`` 21.1 s, ``hermes`` 25.0 s: longer prompts and
    answers)."""
    text = template or ""
    if "<tool_call>" in text:
        return FORMATS["hermes"]
    if "<|python_tag|>" in text or "ipython" in text:
        return FORMATS["llama3"]
    return FORMATS["json"]


def tool_signatures(tools: list[Any]) -> str:
    """One line of JSON per tool, ``{"type": "function", "function": {...}}``, as the
    templates that render tools write them."""
    return "\n".join(
        json.dumps(
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters,
                },
            },
            ensure_ascii=False,
        )
        for tool in tools
    )


def describe_tools(form: ToolFormat, tools: list[Any], max_calls: int, required: bool) -> str:
    """The system prompt's tool section, in ``form``'s own syntax."""
    key = form.arguments_key
    call = f'{{"name": <function name>, "{key}": <its arguments as a JSON object>}}'
    lines = [
        "You may call functions to answer the user. Their signatures, inside <tools></tools>:",
        "<tools>",
        tool_signatures(tools),
        "</tools>",
    ]
    if form.name == "hermes":
        lines.append("For each call, write the function's name and arguments as JSON inside")
        lines.append(f"<tool_call></tool_call> tags:\n<tool_call>\n{call}\n</tool_call>")
    elif form.name == "smollm2":
        lines.append("To call them, write a JSON list of calls inside <tool_call></tool_call>:")
        lines.append(f"<tool_call>[{call}, ...]</tool_call>")
    else:
        lines.append(f"To call one, answer with JSON only: {call}")
    if not required:
        lines.append("If no call is needed, answer in plain text.")
    elif max_calls > 1:
        lines.append(f"Make between 1 and {max_calls} calls.")
    return "\n".join(lines)


def read_tagged(form: ToolFormat, text: str) -> tuple[str, list[Any] | None]:
    """The text before the first tag and each tag's body as JSON (``None``: no tag).

    Raises:
        ValueError (``json.JSONDecodeError`` included): a tag is not ``opening JSON
            closing`` (only a cut-off or unconstrained output can be).
    Costs one JSON parse per tag.
    """
    assert form.trigger is not None
    trigger, opening = form.trigger.decode(), form.opening.decode()
    closing = form.closing.decode().strip()  # the whitespace around a body is skipped
    at = text.find(trigger)
    if at < 0:
        return text, None
    decoder, bodies, cursor = json.JSONDecoder(), [], at
    while cursor < len(text):
        if not text.startswith(opening, cursor):
            raise ValueError(f"a tool call does not start with {opening!r} at {cursor}")
        body, cursor = decoder.raw_decode(text, _skip_space(text, cursor + len(opening)))
        cursor = _skip_space(text, cursor)
        if not text.startswith(closing, cursor):
            raise ValueError(f"a tool call does not end with {closing!r} at {cursor}")
        bodies.append(body)
        cursor = _skip_space(text, cursor + len(closing))
    content = text[:at] if text[:at].strip() else ""
    return content, bodies


def _skip_space(text: str, cursor: int) -> int:
    match = _WHITESPACE.match(text, cursor)
    assert match is not None  # \s* matches everywhere
    return match.end()
