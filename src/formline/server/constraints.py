"""From a :class:`ChatRequest`'s constraint or tools to a compiled grammar and an after-check.

Each request's constraint (or its tools, mapped onto one) compiles into a core
:class:`~formline.constraint.Plan`. Compiled grammars are shared across requests through
the thread-safe default :class:`~formline.mask.compiler.CompileCache` (no global lock: two
schemas compile side by side, a text-only request waits for none); each request gets its
own :class:`~formline.mask.GrammarMatcher` (see :mod:`.engine`).

Tools: ``tool_choice`` named → the output is that function's arguments (its parameters
schema); ``required`` → a JSON array of 1 to ``max_tool_calls`` call objects
``{"name": const, "arguments": parameters}`` (``anyOf`` over the tools), as vLLM builds it,
or, with ``parallel_tool_calls`` false, one such object; ``auto`` → a grammar whose
first byte decides: ``{`` or ``[`` starts the tool call(s) (fully constrained), any other
byte starts free text. So under ``auto`` the model chooses with its first byte; an answer
that begins with ``{`` or ``[`` is always a tool call. That is the ``json`` tool format;
``llama3`` is the same with ``parameters`` for ``arguments``. The tagged formats
(``hermes``, ``smollm2``, :mod:`.tool_formats`) write calls in the model's own tags:
``auto`` is free text then optional tags, ``required`` the tags alone.
"""

from __future__ import annotations

import time
from typing import Any

from formline.constraint import Constraint, Plan, compact_json, compile_error_message
from formline.grammar.budget import DEFAULT_COMPILE_SECONDS, CompileBudget
from formline.grammar.ir import Choice as ChoiceNode
from formline.grammar.ir import Grammar, GrammarError, RuleReference
from formline.grammar.regex import parse_regex
from formline.grammar.tags import tagged_grammar
from formline.mask.compiler import default_cache
from formline.mask.tagged import TagError, trigger_of
from formline.pipeline.generate import DEFAULT_WHITESPACE
from formline.schema import SchemaError
from formline.schema.metaschema import check_schema
from formline.server.errors import ApiError
from formline.server.requests import ChatRequest, Tool
from formline.server.tool_formats import FORMATS, ToolFormat, describe_tools
from formline.vocab import Vocabulary

# A request whose deadline is (nearly) spent still gets this much: its compile then fails
# at once with a 400 naming the time limit, instead of a budget of zero.
MINIMUM_SECONDS = 0.05
AUTO_START = "formline_tool_or_text"
FREE_TEXT_NOT_JSON = r"[^{\[][\s\S]*"


def plan_output(
    request: ChatRequest,
    vocabulary: Vocabulary,
    deadline: float | None = None,
    compile_seconds: float = DEFAULT_COMPILE_SECONDS,
    tool_format: ToolFormat = FORMATS["json"],
) -> Plan:
    """The compiled constraint of ``request`` for ``vocabulary`` (its tools, if any, in
    ``tool_format``).

    ``deadline`` (a ``time.monotonic()`` value): the request's. The compile's budget is
    ``compile_seconds`` or what is left before ``deadline``, whichever is less, and the
    compile stops at it (a 400 naming the limit), so a hostile schema costs at most that.

    Raises:
        ApiError: 400 for ``formline_think`` on a grammar without a fixed first byte, and
            for a schema, regex or grammar that does not compile or is past a compile
            limit (time, states, counts; the message names the request field, the limit
            and, for a schema, the keyword and JSON pointer); 504 when the request
            was already past ``deadline`` once compiled.
    Costs one compile the first time a constraint is seen; a dictionary lookup afterwards.
    """
    seconds = compile_seconds
    if deadline is not None:
        seconds = min(seconds, deadline - time.monotonic())
    budget = CompileBudget(seconds=max(seconds, MINIMUM_SECONDS))
    plan = _plan(request, vocabulary, budget, tool_format)
    if request.think and plan.compiled is not None:
        try:  # thinking ends at the answer's first byte: the grammar needs a fixed one
            trigger_of(plan.compiled)
        except TagError as error:
            raise ApiError(
                str(error), param="formline_think", code="unsupported_parameter"
            ) from error
    if deadline is not None and time.monotonic() > deadline:
        raise ApiError(
            "compiling the output constraint ran past this server's time limit per request; "
            "simplify the schema or start the server with a larger --request-seconds",
            status=504,
            code="timeout",
            error_type="timeout",
        )
    return plan


def _plan(
    request: ChatRequest, vocabulary: Vocabulary, budget: CompileBudget, form: ToolFormat
) -> Plan:
    if request.tool_choice != "none":
        return _tool_plan(request, vocabulary, budget, form)
    # Tools the model may not call still have to be valid schemas, as OpenAI checks them (a
    # malformed one passed unnoticed); checked, not compiled: about 5 µs each.
    for index, tool in enumerate(request.tools):
        try:
            check_schema(tool.parameters)
        except SchemaError as error:
            raise _compile_error(error, request.fields.parameters_of(index)) from error
    constraint = request.constraint
    try:
        return constraint.compile(vocabulary, budget)
    except (SchemaError, GrammarError) as error:
        raise _compile_error(error, constraint.source) from error


def _compile_error(error: SchemaError | GrammarError, param: str) -> ApiError:
    message, code = compile_error_message(error, param)
    return ApiError(message, param=param, code=code)


def tool_call_schema(
    tools: list[Tool], max_calls: int = 1, key: str = "arguments", array: bool = False
) -> dict[str, Any]:
    """The JSON Schema of one call of any of ``tools`` (``{"name", key}``), or, when
    ``max_calls > 1`` or ``array``, of an array of 1 to ``max_calls`` such calls."""
    options: list[dict[str, Any]] = [
        {
            "type": "object",
            "properties": {"name": {"const": tool.name}, key: tool.parameters},
            "required": ["name", key],
            "additionalProperties": False,
        }
        for tool in tools
    ]
    call = options[0] if len(options) == 1 else {"anyOf": options}
    if max_calls <= 1 and not array:
        return call
    return {"type": "array", "items": call, "minItems": 1, "maxItems": max_calls}


def _tools_description(tools: list[Tool], parallel: bool) -> str:
    lines = ["You can call these functions:"]
    for tool in tools:
        parameters = compact_json(tool.parameters)
        lines.append(f"- {tool.name}: {tool.description} Parameters: {parameters}")
    call = '{"name": <function>, "arguments": {...}}'
    if parallel:
        lines.append(f"To call them, answer with a JSON array of one or more calls: [{call}, ...].")
    else:
        lines.append(f"To call one, answer with JSON: {call}.")
    return "\n".join(lines)


def _tool_plan(
    request: ChatRequest, vocabulary: Vocabulary, budget: CompileBudget, form: ToolFormat
) -> Plan:
    tools, strict = request.tools, all(tool.strict for tool in request.tools)
    if request.tool_choice == "named":
        index, tool = next((i, t) for i, t in enumerate(tools) if t.name == request.named_tool)
        param = request.fields.parameters_of(index)
        constraint = _tool_constraint(tool.parameters, tool.strict, param)
        try:
            plan = constraint.compile(vocabulary, budget)
        except SchemaError as error:
            raise _compile_error(error, param) from error
        plan.description = (
            f"Call the function {tool.name} ({tool.description}). Answer with its arguments "
            f"as JSON matching: {compact_json(tool.parameters)}"
        )
        plan.mode, plan.tool_name = "tool_named", tool.name
        return plan
    parallel = request.parallel_tool_calls and form.parallel
    max_calls = request.max_tool_calls if parallel else 1
    # One tag per call (hermes) checks each call; one tag of all calls (smollm2), the array.
    per_tag = form.is_tagged and not form.list_body
    schema = tool_call_schema(
        tools, 1 if per_tag else max_calls, form.arguments_key, array=form.list_body
    )
    constraint = _tool_constraint(schema, strict, "tools")
    try:
        plan = constraint.compile(vocabulary, budget)
        grammar = _tool_grammar(constraint, form, request.tool_choice, max_calls)
        if grammar is not None:
            plan.compiled = (
                Constraint("grammar", grammar, source="tools").compile(vocabulary, budget).compiled
            )
    except SchemaError as error:
        raise _tool_error(error, request, form.arguments_key) from error
    except GrammarError as error:
        raise _compile_error(error, "tools") from error
    plan.tool_format = form.name
    if form.is_tagged:
        plan.mode = "tool_tagged"
        required = request.tool_choice == "required"
        plan.description = describe_tools(form, tools, max_calls, required)
        return plan
    plan.mode = "tool_auto" if request.tool_choice == "auto" else "tool_wrapped"
    plan.description = (
        describe_tools(form, tools, max_calls, request.tool_choice == "required")
        if form.name == "llama3"
        else _tools_description(tools, max_calls > 1)
    )
    return plan


def _tool_grammar(
    constraint: Constraint, form: ToolFormat, choice: str, max_calls: int
) -> Grammar | None:
    """The grammar of a tool-calling answer (``None``: the call schema's own grammar).
    Cached by the call schema's grammar and the answer's form: the schema's grammar comes
    from the cache without its node objects, and rebuilding them to compose this one cost
    more than the rest of a request's plan (meltano.schema's 1,561 nodes: 0.9 ms, on top of
    0.9 ms to flatten the composed grammar)."""
    if not form.is_tagged and choice != "auto":
        return None
    body = constraint.grammar()
    assert body is not None
    tags = (1 if form.list_body else max_calls) if form.is_tagged else 0  # only tags count
    key = ("tool-grammar", body.fingerprint(), form, choice == "auto", tags)
    stored = default_cache().memoize(
        key, lambda: _composed(body, form, choice, tags), Grammar.memory_bytes
    )
    return stored.compact()


def _composed(body: Grammar, form: ToolFormat, choice: str, tags: int) -> Grammar:
    """:func:`_tool_grammar`'s grammar, built, compact."""
    if not form.is_tagged:
        composed = _tool_or_text(body)
    else:
        assert form.trigger is not None
        composed = tagged_grammar(
            body, form.trigger, form.opening, form.closing, text_first=choice == "auto",
            max_tags=tags,
        )  # fmt: skip
    return composed.compact()


def _tool_constraint(schema: dict[str, Any], strict: bool, param: str) -> Constraint:
    return Constraint(
        "json_schema", schema, strict, whitespace=DEFAULT_WHITESPACE, close_objects=True,
        source=param,
    )  # fmt: skip


def _tool_error(error: SchemaError, request: ChatRequest, key: str) -> ApiError:
    """The 400 for ``error`` in :func:`tool_call_schema`'s schema of ``request``'s tools,
    naming the tool's parameters and the pointer inside them: it named the wrapper's
    (``/anyOf/1/properties/arguments/properties/b`` for the second tool's ``/properties/b``),
    which is no place in the request."""
    index, pointer = _tool_at(error.pointer, len(request.tools) > 1, key)
    if index is None:
        return _compile_error(error, "tools")
    inside = SchemaError(error.message, pointer, error.keyword, error.limit)
    return _compile_error(inside, request.fields.parameters_of(index))


def _tool_at(pointer: str, several: bool, key: str = "arguments") -> tuple[int | None, str]:
    """The tool whose ``parameters`` hold ``pointer`` of :func:`tool_call_schema`'s schema
    (``/items/anyOf/2/properties/arguments/...``) and the pointer inside them; ``None`` and
    ``pointer`` unchanged when it points at the wrapper itself."""
    parts = pointer.split("/")[1:] if pointer.startswith("/") else []
    parts = parts[1:] if parts[:1] == ["items"] else parts
    index = "0"
    if several:
        if parts[:1] != ["anyOf"] or len(parts) < 2 or not parts[1].isdigit():
            return None, pointer
        index, parts = parts[1], parts[2:]
    if parts[:2] != ["properties", key]:
        return None, pointer
    return int(index), "".join(f"/{part}" for part in parts[2:])


def _tool_or_text(grammar: Grammar) -> Grammar:
    """Tool call(s) (start with ``{`` or ``[``) or free text (starts with anything else)."""
    text = parse_regex(FREE_TEXT_NOT_JSON)
    rules = dict(grammar.rules)
    rules[AUTO_START] = ChoiceNode((RuleReference(grammar.start), text))
    return Grammar(rules, AUTO_START, called_rules=grammar.called_rules)
