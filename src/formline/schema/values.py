"""The per-type branches of a schema object: null, boolean, numbers, strings, arrays, enums.

Objects live in :mod:`.objects`. Each builder records what it did with each keyword of its
type in the compiler's report.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from functools import cache
from typing import TYPE_CHECKING, Any

from formline.grammar.ir import EMPTY, GrammarError, Literal, Node, Repeat, expanded_size
from formline.grammar.regex import parse_regex
from formline.schema.formats import FORMAT_GAPS, format_node
from formline.schema.json_text import NOTHING, choice, minimized, optional, sequence
from formline.schema.merge import (
    ALL_TYPE_KEYWORDS,
    ALL_TYPES,
    TYPE_KEYWORDS,
    Schema,
    json_equal,
    type_set,
)
from formline.schema.numbers import integer_bounds_from_schema, integer_node, number_node
from formline.schema.patterns import pattern_node
from formline.schema.report import SchemaError

if TYPE_CHECKING:
    from formline.schema.compiler import SchemaCompiler

# A string length bound is a counter the automaton unrolls, ~14 DFA states a character
# (UTF-8 and escapes): maxLength 255 cost 3,581 states and 2.4 s to compile with Llama-3,
# maxLength 64 cost 907 states and 0.5 s, the extraction-dev ticket schema (maxLength 120)
# 1.0 s (0.6 s with SmolLM2); maxLength 5000 alone needed over 20,000 DFA states (the limit).
# Past this many characters a length bound is checked after decoding instead (reported so):
# at 64, 5 of 72 ticket summaries broke their maxLength of 120 (formline eval).
MAX_ENFORCED_LENGTH = 128
# A bounded repetition is unrolled by the automaton builder: {0,50} of a 20-state item is
# 1,000 NFA states. Items bigger than this many IR nodes become a called rule instead.
INLINE_ITEM_NODES = 40
# Python's repr of an integral float from 1e16 up to the largest double (1.8e308).
LARGE_INTEGER_FLOAT = r"[1-9](\.[0-9]{1,16})?e\+(1[6-9]|[2-9][0-9]|[12][0-9][0-9]|30[0-8])"
LARGE_INTEGER_FLOOR = 10**16  # the least value LARGE_INTEGER_FLOAT writes
# An unbounded repetition writes its item twice; past this many IR nodes it is called.
INLINE_REPEATED_NODES = 1_000
# A string value whose automaton is estimated at more than this many NFA states (a uri is
# 715, an email 856, a string of at most 8 characters 402) is written once inline and, at
# every further place, as a call of one shared rule: Github_ultra o41081's twelve uri
# properties were 14,300 of its 44,723 NFA states, each copy built, trimmed and walked apart.
SHARED_STRING_SIZE = 200
# A counted repetition (minItems, maxItems, minProperties, maxProperties) is unrolled into
# one automaton: past this many IR nodes it would be at least that many states per copy.
MAX_UNROLLED_NODES = 20_000


NULL = Literal(b"null")
# The keywords an enum's values are filtered by: the type keywords, "type" and "nullable"
# (draft 4's boolean "exclusiveMinimum" is one of them, read beside its own "minimum").
LOCAL_KEYWORDS = ALL_TYPE_KEYWORDS | {"type", "nullable"}
BOOLEAN = choice([Literal(b"true"), Literal(b"false")])


def typed_value(
    compiler: SchemaCompiler, schema: Schema, pointer: str, resolver: Any, depth: int
) -> Node:
    """The alternation of one branch per JSON type ``schema`` allows."""
    declared = type_set(schema, pointer)
    types = set(ALL_TYPES) if declared is None else declared  # type_set made it: ours
    if declared is not None:
        compiler.record("enforced", "type", pointer)
    if schema.get("nullable") is True:
        types.add("null")
        compiler.record("enforced", "nullable", pointer, "null allowed (OpenAPI form)")
    if "enum" in schema or "const" in schema:
        return enum_value(compiler, schema, types, pointer)
    if declared is None and not _has_type_keywords(schema):
        return compiler.any_value()
    if "number" in types:
        types.discard("integer")
    _record_inapplicable(compiler, schema, types, pointer)
    # One branch per type, in ALL_TYPES' order; tested in line (a dict of seven closures made
    # per call was 1-2 µs of each of a big schema's hundreds of values).
    branches: list[Node] = []
    for name in ALL_TYPES:
        if name not in types:
            continue
        if name == "null":
            branches.append(NULL)
        elif name == "boolean":
            branches.append(BOOLEAN)
        elif name == "integer" or name == "number":
            branches.append(number_value(compiler, schema, pointer, integer=name == "integer"))
        elif name == "string":
            branches.append(string_value(compiler, schema, pointer))
        elif name == "array":
            branches.append(array_value(compiler, schema, pointer, resolver, depth))
        else:
            branches.append(compiler.object_value(schema, pointer, resolver, depth))
    return choice(branches)


def _has_type_keywords(schema: Schema) -> bool:
    return any(keyword in schema for keywords in TYPE_KEYWORDS.values() for keyword in keywords)


def _record_inapplicable(
    compiler: SchemaCompiler, schema: Schema, types: set[str], pointer: str
) -> None:
    # Most schema objects hold no keyword of another type: their keys are tested once each,
    # not the 30 keywords of the seven types against the object.
    if not any(keyword in ALL_TYPE_KEYWORDS for keyword in schema):
        return
    for type_name, keywords in TYPE_KEYWORDS.items():
        if type_name in types or (type_name == "number" and "integer" in types):
            continue
        for keyword in keywords:
            if keyword in schema:
                compiler.record("ignored", keyword, pointer, f"applies to {type_name}s only")


def enum_value(compiler: SchemaCompiler, schema: Schema, types: set[str], pointer: str) -> Node:
    """``enum``/``const``: the literal texts of the values that pass the other keywords."""
    if not isinstance(schema.get("enum", []), list):  # before list(): list(5) is a TypeError
        raise SchemaError("enum must be an array", pointer, "enum")
    values = list(schema["enum"]) if "enum" in schema else [schema["const"]]
    if "const" in schema and "enum" in schema:
        values = [value for value in values if json_equal(value, schema["const"])]
    rest = {key: value for key, value in schema.items() if key not in ("enum", "const")}
    values = [value for value in values if _type_allowed(_json_type(value), types)]
    constraints = {key for key in rest if key in ALL_TYPE_KEYWORDS}
    if constraints:
        values = _filter_by_schema(compiler, values, rest, constraints, pointer)
    for keyword in ("enum", "const"):
        if keyword in schema:
            compiler.record("enforced", keyword, pointer)
    return compiler.enum_node(values, pointer)


def _filter_by_schema(
    compiler: SchemaCompiler, values: list[Any], rest: Schema, constraints: set[str], pointer: str
) -> list[Any]:
    """Keep the enum values that the sibling keywords accept, checked as the after-check
    checks them (:meth:`~formline.schema.compiler.SchemaCompiler.instance_validator`): the
    root's own draft (draft 7's rules read draft 4's ``exclusiveMinimum: true`` as the
    bound 1, and kept 5 under ``minimum`` 5) with that draft's format checker (a bare
    ``FormatChecker()`` has draft 3's ``time``, which refused ``08:30:06Z``), and
    ``nullable`` beside ``type`` (without it ``null`` was dropped from an enum that lists
    it under ``"type": "string", "nullable": true``)."""
    local = {key: value for key, value in rest.items() if key in LOCAL_KEYWORDS}
    if any("$ref" in str(local.get(key)) for key in local):
        for keyword in sorted(constraints):
            compiler.record("checked_after", keyword, pointer, "beside enum, with a $ref")
        return values
    validator = compiler.instance_validator(local)
    for keyword in sorted(constraints):
        compiler.record("enforced", keyword, pointer, "enum values filtered by it")
    return [value for value in values if validator.is_valid(value)]


def number_value(compiler: SchemaCompiler, schema: Schema, pointer: str, integer: bool) -> Node:
    """Integers or numbers within exact decimal bounds."""
    bounds = _bounds(schema, pointer)
    minimum, maximum, exclusive_minimum, exclusive_maximum = bounds
    for keyword in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        if keyword in schema:
            compiler.record("enforced", keyword, pointer)
    multiple = schema.get("multipleOf")
    if multiple is not None:
        if not _is_number(multiple) or multiple <= 0:
            raise SchemaError("multipleOf must be a number > 0", pointer, "multipleOf")
        if multiple == 1 and integer:
            compiler.record("enforced", "multipleOf", pointer, "1 for integers")
        else:
            compiler.record("checked_after", "multipleOf", pointer, "divisibility")
    try:
        # Bounds are digit trees whose subset construction leaves equal futures apart (8 DFA
        # states for one of "1.1" and "2.0" under 1 to 1000): minimised as one piece.
        if integer:
            low, high = integer_bounds_from_schema(*bounds)
            digits = sequence(integer_node(low, high), optional(Literal(b".0")))
            return minimized(choice([digits, *_large_integer_floats(low, high)]))
        return minimized(number_node(minimum, maximum, exclusive_minimum, exclusive_maximum))
    except ValueError:
        return NOTHING  # an empty range: no number of this type is valid


def _large_integer_floats(low: int | None, high: int | None) -> list[Node]:
    """The exponent spellings of integers past 1e16 on each unbounded side: ``json.dumps``
    writes the float 1e16 as ``1e+16``, an integer to JSON Schema, which the grammar used to
    refuse. With an exponent of 16 or more and at most 16 fraction digits every such text is
    an integer; a bounded side gets none (the digits alone keep the bound exact). Where the
    other bound is past 1e16, only exponents whose every value is past it (under minimum
    1e20, 1e+16 was accepted)."""
    options: list[Node] = []
    if high is None:
        options.extend(_large_integer_float(low))
    if low is None:
        negative = _large_integer_float(None if high is None else -high)
        options.extend(sequence(Literal(b"-"), node) for node in negative)
    return options


def _large_integer_float(least: int | None) -> list[Node]:
    """The exponent spellings of magnitudes at least ``least`` (none when it is past 1e308)."""
    if least is None or least <= LARGE_INTEGER_FLOOR:
        return [_any_large_integer_float()]
    exponent = len(str(least - 1))  # the least k with 10**k >= least
    if exponent > 308:
        return []
    return [sequence(_mantissa(), integer_node(exponent, 308))]


@cache
def _any_large_integer_float() -> Node:
    """:data:`LARGE_INTEGER_FLOAT`'s node, parsed once (twice per integer field, it was a
    sixth of a median schema's grammar build)."""
    return parse_regex(LARGE_INTEGER_FLOAT)


@cache
def _mantissa() -> Node:
    """:data:`LARGE_INTEGER_FLOAT` up to its exponent's digits."""
    return parse_regex(r"[1-9](\.[0-9]{1,16})?e\+")


def _bounds(schema: Schema, pointer: str) -> tuple[Decimal | None, Decimal | None, bool, bool]:
    """(minimum, maximum, exclusive minimum?, exclusive maximum?), the tightest of the
    inclusive and exclusive forms (draft 4's boolean exclusive form included)."""
    minimum = _decimal(schema, "minimum", pointer)
    maximum = _decimal(schema, "maximum", pointer)
    exclusive_minimum = exclusive_maximum = False
    lower = schema.get("exclusiveMinimum")
    upper = schema.get("exclusiveMaximum")
    if lower is True:
        exclusive_minimum = minimum is not None
    elif lower is not None and lower is not False:
        value = _decimal(schema, "exclusiveMinimum", pointer)
        if value is not None and (minimum is None or value >= minimum):
            minimum, exclusive_minimum = value, True
    if upper is True:
        exclusive_maximum = maximum is not None
    elif upper is not None and upper is not False:
        value = _decimal(schema, "exclusiveMaximum", pointer)
        if value is not None and (maximum is None or value <= maximum):
            maximum, exclusive_maximum = value, True
    return minimum, maximum, exclusive_minimum, exclusive_maximum


def _decimal(schema: Schema, keyword: str, pointer: str) -> Decimal | None:
    value = schema.get(keyword)
    if value is None:
        return None
    if not _is_number(value):
        raise SchemaError(f"{keyword} must be a number", pointer, keyword)
    try:
        result = Decimal(str(value))
    except InvalidOperation as error:
        raise SchemaError(f"{keyword} is not a finite number", pointer, keyword) from error
    if not result.is_finite():
        raise SchemaError(f"{keyword} is not a finite number", pointer, keyword)
    return result


def string_value(compiler: SchemaCompiler, schema: Schema, pointer: str) -> Node:
    """A string: ``format`` first, else ``pattern``, else the length bounds (the rest, if
    any, is checked after decoding: the IR has no intersection of two regular languages)."""
    text = compiler.text
    body: Node | None = None
    name = schema.get("format")
    if name is not None:
        body = format_node(str(name))
        if body is None and compiler.format_checker.checkers.get(str(name)):
            compiler.record("checked_after", "format", pointer, f"{name} (by jsonschema)")
        elif body is None:
            compiler.record("ignored", "format", pointer, f"unknown format {name!r}")
        else:
            # A format an older draft does not define (draft 4's "date") is enforced all the
            # same, as 2020-12 defines it: schemas in the wild mean it (MaskBench's labels
            # do), though that draft's validator, and so the after-check, ignores it.
            outside = "" if compiler.is_draft_format(str(name)) else " (as in 2020-12)"
            compiler.record("enforced", "format", pointer, f"{name}{outside}")
            if name in FORMAT_GAPS:
                compiler.record("checked_after", "format", pointer, FORMAT_GAPS[str(name)])
    pattern = schema.get("pattern")
    if pattern is not None:
        if not isinstance(pattern, str):
            raise SchemaError("pattern must be a string", pointer, "pattern")
        if body is not None:
            compiler.record("checked_after", "pattern", pointer, "beside format")
        else:
            try:
                body = pattern_node(pattern)
                compiler.record("enforced", "pattern", pointer)
            except GrammarError as error:
                compiler.unsupported("pattern", pointer, str(error))
    if body is not None:  # a regex: minimised as one piece (see ir.Minimized)
        body = minimized(body)
    body = _length_body(compiler, schema, pointer, body)
    node = text.string(body)
    if expanded_size(node) <= SHARED_STRING_SIZE:
        return node
    return compiler.shared_string(node)


def _length_body(compiler: SchemaCompiler, schema: Schema, pointer: str, body: Node | None) -> Node:
    minimum = count_keyword(schema, "minLength", pointer)
    maximum = count_keyword(schema, "maxLength", pointer, None)
    if body is not None:
        for keyword in ("minLength", "maxLength"):
            if keyword in schema:
                compiler.record("checked_after", keyword, pointer, "beside pattern or format")
        return body
    if minimum > MAX_ENFORCED_LENGTH:
        compiler.record("checked_after", "minLength", pointer, _LENGTH_NOTE)
        minimum = 0
    if maximum is not None and maximum > MAX_ENFORCED_LENGTH:
        compiler.record("checked_after", "maxLength", pointer, _LENGTH_NOTE)
        maximum = None
    for keyword in ("minLength", "maxLength"):
        if keyword in schema and keyword not in _checked_after_here(compiler, pointer):
            compiler.record("enforced", keyword, pointer, "in Unicode characters")
    cap = compiler.options.max_string_length
    if maximum is None and cap is not None:
        maximum = max(cap, minimum)
    if maximum is not None and maximum < minimum:
        return NOTHING
    return compiler.text.any_string_body(minimum, maximum)


_LENGTH_NOTE = f"over {MAX_ENFORCED_LENGTH} characters (the automaton would unroll it)"


def _checked_after_here(compiler: SchemaCompiler, pointer: str) -> set[str]:
    return {use.keyword for use in compiler.report.checked_after if use.pointer == pointer}


def count_keyword(schema: Schema, keyword: str, pointer: str, default: int | None = 0) -> Any:
    """The non-negative integer of count ``keyword`` (``minItems``, ``maxLength``, ...), or
    ``default`` when absent; an integral float counts (``1e30``).

    Raises:
        SchemaError: not a non-negative integer (named with its pointer).
    """
    value = schema.get(keyword, default)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise SchemaError(f"{keyword} must be a non-negative integer", pointer, keyword)
    return value


def array_value(
    compiler: SchemaCompiler, schema: Schema, pointer: str, resolver: Any, depth: int
) -> Node:
    """``[`` prefix items, then repeated items, ``]`` with minItems/maxItems."""
    text = compiler.text
    prefix_schemas, items_schema, items_keyword = _array_items(compiler, schema, pointer)
    minimum = count_keyword(schema, "minItems", pointer)
    maximum = count_keyword(schema, "maxItems", pointer, None)
    for keyword in ("minItems", "maxItems", "prefixItems", "items", "additionalItems"):
        if keyword in schema:
            compiler.record("enforced", keyword, pointer)
    if maximum is not None and maximum < minimum:
        return NOTHING
    prefix = [
        compiler.value(item, f"{pointer}/{keyword}/{index}", resolver, depth + 1)
        for index, (keyword, item) in enumerate(prefix_schemas)
    ]
    item: Node = NOTHING
    if items_schema is not False:
        item = compiler.value(items_schema, f"{pointer}/{items_keyword}", resolver, depth + 1)
    for index, node in enumerate(prefix):
        if index < minimum and node is NOTHING:
            return NOTHING
    elements = _elements(compiler, prefix, item, (minimum, maximum), pointer)
    if elements is NOTHING:
        return NOTHING
    return sequence(text.token(b"["), elements, Literal(b"]"))


def _array_items(
    compiler: SchemaCompiler, schema: Schema, pointer: str
) -> tuple[list[tuple[str, Any]], Any, str]:
    """(prefix item schemas with their keyword, the schema of the rest, its keyword)."""
    items = schema.get("items", True)
    if "prefixItems" in schema and not compiler.is_draft7:
        if not isinstance(schema["prefixItems"], list):  # a $ref target the metaschema missed
            raise SchemaError("prefixItems must be an array", pointer, "prefixItems")
        prefix = [("prefixItems", item) for item in schema["prefixItems"]]
        return prefix, items, "items"
    if isinstance(items, list):
        return (
            [("items", item) for item in items],
            schema.get("additionalItems", True),
            ("additionalItems"),
        )
    return [], items, "items"


def _elements(
    compiler: SchemaCompiler,
    prefix: list[Node],
    item: Node,
    counts: tuple[int, int | None],
    pointer: str,
) -> Node:
    """Elements from position ``len(prefix)`` backwards: each prefix element is optional
    past ``minimum``; the repeated part honours the remaining counts."""
    minimum, maximum = counts
    comma = compiler.text.token(b",")
    space = compiler.text.space
    count = len(prefix)
    if maximum is not None and maximum < count:
        prefix, count = prefix[:maximum], maximum
    tail = repeated_items(
        compiler,
        item,
        (max(0, minimum - count), None if maximum is None else maximum - count),
        first=count == 0,
        where=(pointer, "minItems", "maxItems"),
    )
    for index in range(count - 1, -1, -1):
        separator = EMPTY if index == 0 else comma
        node = sequence(separator, prefix[index], space, tail)
        tail = node if index < minimum else optional(node)
    return tail


def repeated_items(
    compiler: SchemaCompiler,
    item: Node,
    counts: tuple[int, int | None],
    first: bool,
    where: tuple[str, str, str],
) -> Node:
    """``minimum`` to ``maximum`` items (``counts``), the first one without a comma if
    ``first``. ``where``: the pointer and the two count keywords, for a count too large."""
    minimum, maximum = counts
    if is_nothing_node(item) or maximum == 0:
        return EMPTY if minimum == 0 else NOTHING
    size = _size(item)
    if maximum is not None or minimum > 1:
        item = compiler.shared(item, "item") if size > INLINE_ITEM_NODES else item
    elif size > INLINE_REPEATED_NODES:
        # Unbounded, the item is written twice (first, then after each comma): inlined,
        # n nested arrays are 2^n copies (20 levels took 12 s before the automaton).
        item = compiler.shared(item, "item")
    minimum, maximum = _affordable_counts(compiler, _size(item), minimum, maximum, where)
    comma = compiler.text.token(b",")
    element = sequence(item, compiler.text.space)
    if not first:
        return Repeat(sequence(comma, element), minimum, maximum)
    rest = Repeat(
        sequence(comma, element),
        max(0, minimum - 1),
        None if maximum is None else maximum - 1,
    )
    node = sequence(element, rest)
    return node if minimum > 0 else optional(node)


def _affordable_counts(
    compiler: SchemaCompiler,
    item_size: int,
    minimum: int,
    maximum: int | None,
    where: tuple[str, str, str],
) -> tuple[int, int | None]:
    """The counts the automaton can unroll: a count whose copies would pass
    :data:`MAX_UNROLLED_NODES` is an error (limit ``repetition``), or, when unsupported
    keywords go to the after-check, dropped from the grammar and reported so."""
    pointer, minimum_keyword, maximum_keyword = where
    for keyword, count in ((maximum_keyword, maximum), (minimum_keyword, minimum)):
        if count is None or count * (item_size + 2) <= MAX_UNROLLED_NODES:
            continue
        note = (
            f"{keyword} {count} would unroll into about {count * (item_size + 2):,} automaton "
            f"states; the grammar enforces counts up to {MAX_UNROLLED_NODES:,} states"
        )
        if compiler.options.on_unsupported == "error":
            raise SchemaError(f"{note} (limit 'repetition')", pointer, keyword, "repetition")
        compiler.withdraw(keyword, pointer)
        compiler.unsupported(keyword, pointer, note)
        if keyword == maximum_keyword:
            maximum = None
        else:
            minimum = 0
    return minimum, maximum


def is_nothing_node(node: Node) -> bool:
    return node is NOTHING or node == NOTHING


def _size(node: Node) -> int:
    return expanded_size(node)


def _type_allowed(name: str, types: set[str]) -> bool:
    return name in types or (name == "integer" and "number" in types)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
