"""From a :class:`ChatRequest`'s constraint or tools to a compiled grammar and an after-check.

Compiled grammars are shared across requests through the thread-safe default
:class:`~formline.mask.compiler.CompileCache` (no global lock: two schemas compile side by
side, a text-only request waits for none); each request gets its
own :class:`~formline.mask.GrammarMatcher` (see :mod:`.engine`).

Tools: ``tool_choice`` named → the output is that function's arguments (its parameters
schema); ``required`` → a JSON array of 1 to ``max_tool_calls`` call objects
``{"name": const, "arguments": parameters}`` (``anyOf`` over the tools), as vLLM builds it,
or, with ``parallel_tool_calls`` false, one such object; ``auto`` → a grammar whose
first byte decides: ``{`` or ``[`` starts the tool call(s) (fully constrained), any other
byte starts free text. So under ``auto`` the model chooses with its first byte; an answer
that begins with ``{`` or ``[`` is always a tool call.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from formline.grammar.budget import DEFAULT_COMPILE_SECONDS, CompileBudget, CompileLimitError
from formline.grammar.ir import Choice as ChoiceNode
from formline.grammar.ir import Grammar, GrammarError, RuleReference
from formline.grammar.regex import parse_regex
from formline.mask.compiled import CompiledGrammar
from formline.mask.compiler import compile_grammar
from formline.schema import CompiledSchema, SchemaError, compile_schema, schema_to_grammar
from formline.schema.api import SchemaCheck
from formline.schema.compiler import SchemaOptions, check_nesting
from formline.server.closing import close_objects
from formline.server.errors import ApiError
from formline.server.requests import ChatRequest, Constraint, Tool
from formline.vocab import Vocabulary

# A request whose deadline is (nearly) spent still gets this much: its compile then fails
# at once with a 400 naming the time limit, instead of a budget of zero.
MINIMUM_SECONDS = 0.05
AUTO_START = "formline_tool_or_text"
FREE_TEXT_NOT_JSON = r"[^{\[][\s\S]*"


@dataclass
class OutputPlan:
    """How to constrain one request's output and how to read it back.

    ``mode``: ``content`` (text or JSON in ``message.content``), ``tool_named`` (the output
    is the named tool's arguments), ``tool_wrapped`` (a name/arguments object) or
    ``tool_auto`` (a name/arguments object when it starts with ``{``, else text).
    ``checker`` is the after-check of the schema the grammar was compiled from (objects
    closed, see :mod:`.closing`); ``client_check`` that of the client's own schema."""

    compiled: CompiledGrammar | None
    checker: CompiledSchema | None
    description: str
    mode: str = "content"
    is_json: bool = False
    tool_name: str | None = None
    client_check: SchemaCheck | None = None


def plan_output(
    request: ChatRequest,
    vocabulary: Vocabulary,
    deadline: float | None = None,
    compile_seconds: float = DEFAULT_COMPILE_SECONDS,
) -> OutputPlan:
    """The compiled constraint of ``request`` for ``vocabulary``.

    ``deadline`` (a ``time.monotonic()`` value): the request's. The compile's budget is
    ``compile_seconds`` or what is left before ``deadline``, whichever is less, and the
    compile stops at it (a 400 naming the limit), so a hostile schema costs at most that.

    Raises:
        ApiError: 400 for a schema, regex or grammar that does not compile or is past a
            compile limit (time, states, counts; the message names the request field, the
            limit and, for a schema, the keyword and JSON pointer); 504 when the request
            was already past ``deadline`` once compiled.
    Costs one compile the first time a constraint is seen; a dictionary lookup afterwards.
    """
    seconds = compile_seconds
    if deadline is not None:
        seconds = min(seconds, deadline - time.monotonic())
    plan = _plan(request, vocabulary, CompileBudget(seconds=max(seconds, MINIMUM_SECONDS)))
    if deadline is not None and time.monotonic() > deadline:
        raise ApiError(
            "compiling the output constraint ran past this server's time limit per request; "
            "simplify the schema or start the server with a larger --request-seconds",
            status=504,
            code="timeout",
            error_type="timeout",
        )
    return plan


def _plan(request: ChatRequest, vocabulary: Vocabulary, budget: CompileBudget) -> OutputPlan:
    if request.tool_choice != "none":
        return _tool_plan(request, vocabulary, budget)
    constraint = request.constraint
    try:
        return _constraint_plan(constraint, vocabulary, budget)
    except SchemaError as error:
        raise _schema_error(error, constraint.param) from error
    except GrammarError as error:
        raise ApiError(
            f"{constraint.param} does not compile: {error}",
            param=constraint.param,
            code=_grammar_code(error),
        ) from error


def _constraint_plan(
    constraint: Constraint, vocabulary: Vocabulary, budget: CompileBudget
) -> OutputPlan:
    kind, value = constraint.kind, constraint.value
    if kind == "text":
        return OutputPlan(None, None, "")
    if kind == "regex":
        compiled = compile_grammar(Grammar.from_regex(value), vocabulary, budget=budget)
        return OutputPlan(compiled, None, f"Answer with text matching the regex {value}")
    if kind == "choice":
        compiled = compile_grammar(Grammar.from_choices(value), vocabulary, budget=budget)
        return OutputPlan(compiled, None, "Answer with exactly one of: " + ", ".join(value))
    if kind == "grammar":
        return OutputPlan(
            compile_grammar(Grammar.from_ebnf(value), vocabulary, budget=budget), None, ""
        )
    checker = _compile(value, vocabulary, constraint.strict, budget)
    original = SchemaCheck(value)
    if kind == "json_object":
        return OutputPlan(
            checker.compiled_grammar, checker, "Answer with a JSON object.", "content", True,
            client_check=original,
        )  # fmt: skip
    description = "Answer with a JSON value matching this JSON Schema:\n" + _compact(value)
    return OutputPlan(
        checker.compiled_grammar, checker, description, "content", True, client_check=original
    )


def _compile(
    schema: Any, vocabulary: Vocabulary, strict: bool, budget: CompileBudget
) -> CompiledSchema:
    """``strict``: an unsupported keyword is an error; otherwise it is checked after. Open
    objects are closed first, as vLLM's xgrammar does (see :mod:`.closing`); the nesting is
    checked before, as closing recurses per level."""
    on_unsupported = "error" if strict else "check_after"
    check_nesting(schema, 2 * SchemaOptions().max_depth)
    return compile_schema(
        close_objects(schema), vocabulary, on_unsupported=on_unsupported, budget=budget
    )


def _grammar_code(error: GrammarError) -> str:
    return "compile_limit_exceeded" if isinstance(error, CompileLimitError) else "invalid_grammar"


def _schema_error(error: SchemaError, param: str) -> ApiError:
    pointer = error.pointer or "/"
    keyword = f" (keyword '{error.keyword}')" if error.keyword else ""
    limit = f" (compile limit '{error.limit}')" if error.limit else ""
    return ApiError(
        f"{param}: the schema cannot be compiled: {error.message}{keyword}{limit} at JSON "
        f"pointer {pointer}",
        param=param,
        code="compile_limit_exceeded" if error.limit else "invalid_schema",
    )


def tool_call_schema(tools: list[Tool], max_calls: int = 1) -> dict[str, Any]:
    """The JSON Schema of one call of any of ``tools`` (``{"name", "arguments"}``), or, when
    ``max_calls > 1``, of an array of 1 to ``max_calls`` such calls."""
    options: list[dict[str, Any]] = [
        {
            "type": "object",
            "properties": {"name": {"const": tool.name}, "arguments": tool.parameters},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for tool in tools
    ]
    call = options[0] if len(options) == 1 else {"anyOf": options}
    if max_calls <= 1:
        return call
    return {"type": "array", "items": call, "minItems": 1, "maxItems": max_calls}


def _tools_description(tools: list[Tool], parallel: bool) -> str:
    lines = ["You can call these functions:"]
    for tool in tools:
        lines.append(f"- {tool.name}: {tool.description} Parameters: {_compact(tool.parameters)}")
    call = '{"name": <function>, "arguments": {...}}'
    if parallel:
        lines.append(f"To call them, answer with a JSON array of one or more calls: [{call}, ...].")
    else:
        lines.append(f"To call one, answer with JSON: {call}.")
    return "\n".join(lines)


def _tool_plan(request: ChatRequest, vocabulary: Vocabulary, budget: CompileBudget) -> OutputPlan:
    tools, strict = request.tools, all(tool.strict for tool in request.tools)
    if request.tool_choice == "named":
        index, tool = next((i, t) for i, t in enumerate(tools) if t.name == request.named_tool)
        param = f"tools[{index}].function.parameters"
        try:
            checker = _compile(tool.parameters, vocabulary, tool.strict, budget)
        except SchemaError as error:
            raise _schema_error(error, param) from error
        description = (
            f"Call the function {tool.name} ({tool.description}). Answer with its arguments "
            f"as JSON matching: {_compact(tool.parameters)}"
        )
        return OutputPlan(
            checker.compiled_grammar, checker, description, "tool_named", True, tool.name,
            SchemaCheck(tool.parameters),
        )  # fmt: skip
    max_calls = request.max_tool_calls if request.parallel_tool_calls else 1
    schema = tool_call_schema(tools, max_calls)
    try:
        checker = _compile(schema, vocabulary, strict, budget)
        compiled = checker.compiled_grammar
        if request.tool_choice == "auto":
            compiled = compile_grammar(_tool_or_text(schema, strict), vocabulary, budget=budget)
    except SchemaError as error:
        raise _schema_error(error, _tool_at(error.pointer, len(tools) > 1)) from error
    except GrammarError as error:
        raise ApiError(
            f"tools do not compile: {error}", param="tools", code=_grammar_code(error)
        ) from error
    mode = "tool_auto" if request.tool_choice == "auto" else "tool_wrapped"
    description = _tools_description(tools, max_calls > 1)
    return OutputPlan(compiled, checker, description, mode, True, client_check=SchemaCheck(schema))


def _tool_at(pointer: str | None, several: bool) -> str:
    """The request field at ``pointer`` of :func:`tool_call_schema`'s schema: a tool's
    ``parameters`` (``/items/anyOf/2/properties/arguments/...``), else ``tools``."""
    parts = (pointer or "").strip("/").split("/")
    parts = parts[1:] if parts[:1] == ["items"] else parts
    index = "0"
    if several:
        if parts[:1] != ["anyOf"] or len(parts) < 2:
            return "tools"
        index, parts = parts[1], parts[2:]
    return (
        f"tools[{index}].function.parameters"
        if parts[:2] == ["properties", "arguments"]
        else "tools"
    )


def _tool_or_text(schema: dict[str, Any], strict: bool) -> Grammar:
    """Tool call(s) (start with ``{`` or ``[``) or free text (starts with anything else)."""
    on_unsupported = "error" if strict else "check_after"
    grammar, _ = schema_to_grammar(close_objects(schema), on_unsupported=on_unsupported)
    text = parse_regex(FREE_TEXT_NOT_JSON)
    rules = dict(grammar.rules)
    rules[AUTO_START] = ChoiceNode((RuleReference(grammar.start), text))
    return Grammar(rules, AUTO_START, called_rules=grammar.called_rules)


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
