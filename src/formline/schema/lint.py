"""``lint_schema``: a schema's quality and portability problems, before any model runs.

A valid schema can still yield bad data: a closed ``enum`` forces the least wrong value, a
required ``integer`` makes the model invent a number the text never gave, an ``answer``
declared before its ``reasoning`` is committed to first (keys follow schema order), an
unbounded string lets a looping model run to ``max_tokens``. :data:`CODES` lists each stable
code with what it flags and the fix: ``FL000`` (error) is formline's ``SchemaError``,
``FL001``-``FL005`` quality warnings, ``FL1xx`` what OpenAI strict mode rejects and
``FL2xx`` what Anthropic structured outputs reject or loosen, as documented by the
providers in 2025. Portability findings are warnings; with ``provider=`` only that
provider's, as errors (but ``FL206``, a reordering, stays a warning). Anthropic drops
string length bounds, so there ``FL203`` replaces FL004's advice (only with ``"anthropic"``).

Heuristics: ``FL002`` flags a required, non-nullable string/integer/number property only if
its description hints it may be absent ("if", "when", "optional", "may", "unless", "not
stated", ...) or a word of its name is in :data:`OPTIONAL_FACT_WORDS`. ``FL003`` splits
names into words (snake_case, camelCase): a decision (:data:`ANSWER_WORDS`, or a leading
``final``) declared before a reasoning field (:data:`REASONING_WORDS`; a name with both is
reasoning). OpenAI nesting counts property levels. The walk follows local ``$ref``s,
reports each one that closes a cycle, and lints ``$defs`` no ``$ref`` reaches too. Costs a
tokenizer-free compile (milliseconds) and a walk linear in the schema's size.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Literal
from urllib.parse import unquote

from formline.schema.api import schema_grammar, schema_of
from formline.schema.nesting import check_nesting
from formline.schema.report import SchemaError

Severity = Literal["warning", "error"]
PROVIDERS = ("openai", "anthropic")
OPENAI, ANTHROPIC = "OpenAI strict mode", "Anthropic structured outputs"
CODES = {  # code: (what it flags, the fix)
    "FL000": ("formline cannot compile the schema", "see `formline compile --schema SCHEMA`"),
    "FL001": ("closed enum: a value outside it is forced onto the least wrong one",
              'add "other" plus a free-text reason field, or make the field nullable'),
    "FL002": ("required, not nullable, and the source may not state it: the model invents it",
              '"type": ["<type>", "null"]'),
    "FL003": ("decision before the reasoning it depends on (keys follow schema order)",
              "move the reasoning first: field order is the model's reasoning budget"),
    "FL004": ("string without maxLength: a looping model runs to max_tokens", 'add "maxLength"'),
    "FL005": ("array without maxItems: a looping model runs to max_tokens", 'add "maxItems"'),
    "FL101": (f"{OPENAI}: every property must be required", "require it, with a nullable type"),
    "FL102": (f"{OPENAI}: additionalProperties must be false", '"additionalProperties": false'),
    "FL103": (f"{OPENAI}: over 5,000 properties in total", "split the schema"),
    "FL104": (f"{OPENAI}: over 10 levels of nesting", "flatten the schema"),
    "FL105": (f"{OPENAI}: over 1,000 enum values in total", "use fewer enum values"),
    "FL106": (f"{OPENAI}: unsupported keyword", "drop it (check it after decoding) or use anyOf"),
    "FL107": (f"{OPENAI}: the root must be an object, not anyOf", "wrap it in an object"),
    "FL201": (f"{ANTHROPIC}: no recursive schemas ($ref cycle)", "unroll it to a fixed depth"),
    "FL202": (f"{ANTHROPIC}: numeric bounds are dropped", "describe them; check after decoding"),
    "FL203": (f"{ANTHROPIC}: length bounds are dropped", "describe them; cap max_tokens"),
    "FL204": (f"{ANTHROPIC}: minItems must be 0 or 1", '"minItems": 1; check the rest after'),
    "FL205": (f"{ANTHROPIC}: additionalProperties must be false", '"additionalProperties": false'),
    "FL206": (f"{ANTHROPIC} emit required properties first: this optional one moves later",
              "make it required (nullable) or declare it last"),
    "FL207": (f"{ANTHROPIC}: over 24 optional properties", "make some required (nullable)"),
    "FL208": (f"{ANTHROPIC}: over 16 union-typed properties", "use fewer (nullable counts)"),
}  # fmt: skip
# fmt: off
ESCAPE_VALUES = frozenset({
    "other", "unknown", "none", "n/a", "na", "not_applicable", "unclear", "not_stated"})
OPTIONAL_FACT_WORDS = frozenset({
    "notice", "deadline", "phone", "email", "fax", "website", "middle", "nickname", "expiry",
    "expiration", "renewal", "termination", "penalty", "maiden", "suffix"})
ANSWER_WORDS = frozenset({
    "decision", "answer", "recommendation", "verdict", "label", "category", "score", "rating",
    "conclusion", "classification"})
REASONING_WORDS = frozenset({
    "reasoning", "rationale", "evidence", "analysis", "explanation", "summary", "thoughts",
    "thought", "steps", "justification", "quote", "quotes", "cot"})
# fmt: on
OPTIONAL_HINT = re.compile(
    r"\b(if|when|whenever|unless|optional(ly)?|may|might|if any|where available"
    r"|not (stated|given|mentioned|specified|present))\b",
    re.IGNORECASE,
)
OPENAI_UNSUPPORTED = (
    "allOf", "oneOf", "not", "if", "then", "else", "dependentRequired", "dependentSchemas",
    "dependencies", "patternProperties", "propertyNames", "unevaluatedProperties",
    "unevaluatedItems", "contains", "minContains", "maxContains", "minProperties",
    "maxProperties", "uniqueItems", "$dynamicRef", "$dynamicAnchor", "$recursiveRef",
)  # fmt: skip
NUMERIC_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
OPENAI_MAX_DEPTH, OPENAI_MAX_PROPERTIES, OPENAI_MAX_ENUM_VALUES = 10, 5000, 1000
ANTHROPIC_MAX_OPTIONAL, ANTHROPIC_MAX_UNIONS = 24, 16
_VALUE_KEYWORDS = (
    "items", "additionalItems", "contains", "not", "if", "then", "else", "propertyNames",
    "unevaluatedItems", "unevaluatedProperties",
)  # fmt: skip
_LIST_KEYWORDS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_PROPERTY_KEYWORDS = ("properties", "patternProperties")
_STRING_BOUNDS = frozenset(("enum", "const", "format", "pattern", "maxLength"))


@dataclass(frozen=True)
class LintFinding:
    """One problem: its stable ``code``, where it is (a JSON pointer) and how to fix it."""

    code: str
    severity: Severity
    pointer: str
    message: str
    fix: str

    def to_dict(self) -> dict[str, str]:
        return dict(asdict(self))

    def __str__(self) -> str:
        where = self.pointer or "/"
        return f"{self.severity} {self.code} {where}: {self.message}; fix: {self.fix}"


@dataclass(frozen=True)
class _Node:
    schema: dict[str, Any]
    pointer: str
    depth: int  # property levels above this schema (the root's properties are at 1)
    nullable: bool  # null is admitted here or by the anyOf/oneOf right around it


@dataclass
class _Walk:
    """Every schema object reachable from the root, with its context, and the cycles."""

    root: Any
    nodes: list[_Node] = field(default_factory=list)
    cycles: list[str] = field(default_factory=list)  # pointers of $refs closing a cycle
    seen: set[tuple[str, bool, int]] = field(default_factory=set)
    reached: set[str] = field(default_factory=set)

    def visit(
        self, schema: Any, at: tuple[str, int, bool], stack: tuple[str, ...], via: str
    ) -> None:
        """Walk ``schema`` at (pointer, depth, nullable); ``via`` is the last $ref taken."""
        pointer, depth, nullable = at
        if pointer in stack:
            self.cycles.append(via)
            return
        key = (pointer, nullable, min(depth, OPENAI_MAX_DEPTH + 1))
        if not isinstance(schema, dict) or key in self.seen:
            return
        self.seen.add(key)
        self.reached.add(pointer)
        node = _Node(schema, pointer, depth, nullable or self.admits_null(schema))
        self.nodes.append(node)
        stack = (*stack, pointer)
        reference = schema.get("$ref")
        target = self.resolve(reference) if isinstance(reference, str) else None
        if target is not None:
            self.visit(target[1], (target[0], depth, node.nullable), stack, pointer)
        for child, child_pointer, is_property, is_branch in _children(schema, pointer):
            context = (child_pointer, depth + is_property, is_branch and node.nullable)
            self.visit(child, context, stack, via)

    def visit_definitions(self) -> None:
        """Lint the root's ``$defs`` that no ``$ref`` reached, each as its own root."""
        for keyword in ("$defs", "definitions"):
            for name, schema in _items(self.root.get(keyword)):
                if _join("", keyword, name) not in self.reached:
                    self.visit(schema, (_join("", keyword, name), 0, False), (), "")

    def resolve(self, reference: str) -> tuple[str, Any] | None:
        """(canonical pointer, target) of a local ``$ref`` (``None``: not local, not found)."""
        if reference != "#" and not reference.startswith("#/"):
            return None
        target, parts = self.root, []
        for part in reference[2:].split("/") if reference != "#" else []:
            part = unquote(part).replace("~1", "/").replace("~0", "~")
            if isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            elif isinstance(target, dict) and part in target:
                target = target[part]
            else:
                return None
            parts.append(part)
        return _join("", *parts), target

    def deref(self, schema: Any) -> Any:
        """``schema`` with its ``$ref`` chain followed (at most 16 steps)."""
        for _ in range(16):
            reference = schema.get("$ref") if isinstance(schema, dict) else None
            target = self.resolve(reference) if isinstance(reference, str) else None
            if target is None:
                return schema
            schema = target[1]
        return schema

    def admits_null(self, schema: Any, depth: int = 0) -> bool:
        schema = self.deref(schema)
        if not isinstance(schema, dict) or depth > 8:
            return schema is True
        if "null" in _types(schema) or schema.get("nullable") is True:
            return True
        if None in _list(schema.get("enum")) or ("const" in schema and schema["const"] is None):
            return True
        branches = [*_list(schema.get("anyOf")), *_list(schema.get("oneOf"))]
        return any(self.admits_null(branch, depth + 1) for branch in branches)


def lint_schema(source: Any, provider: str | None = None) -> list[LintFinding]:
    """Every finding of :data:`CODES` for ``source`` (a dict, JSON text or Pydantic model).

    ``provider`` (``"openai"``, ``"anthropic"`` or ``None`` for both, as warnings) selects
    the portability checks. Raises ``SchemaError`` when ``source`` is not a schema at all.
    """
    if provider is not None and provider not in PROVIDERS:
        raise ValueError(f"provider must be one of {PROVIDERS}, not {provider!r}")
    schema = schema_of(source)
    try:
        check_nesting(schema, 256)  # the walk recurses per level
    except SchemaError as error:
        return [_compile_error(error)]
    findings: list[LintFinding] = []
    try:
        schema_grammar(schema)
    except SchemaError as error:
        findings.append(_compile_error(error))
    except RecursionError:  # the compiler's recursion (seen on objects of ~500 properties)
        findings.append(_compile_error(SchemaError("the compiler ran out of recursion depth")))
    if not isinstance(schema, dict):
        return findings
    walk = _Walk(schema)
    walk.visit(schema, ("", 0, False), (), "")
    walk.visit_definitions()
    seen: set[LintFinding] = set()
    for code, pointer, message, fix in (*_quality(walk), *_openai(walk), *_anthropic(walk)):
        if not _selected(code, provider):
            continue
        strict = provider is not None and code[2] in "12" and code != "FL206"
        finding = LintFinding(code, "error" if strict else "warning", pointer, message, fix)
        if finding not in seen:
            seen.add(finding)
            findings.append(finding)
    return findings


def _compile_error(error: SchemaError) -> LintFinding:
    return LintFinding("FL000", "error", error.pointer, str(error), CODES["FL000"][1])


def _selected(code: str, provider: str | None) -> bool:
    """Whether ``code`` applies: only the chosen provider's portability codes; a string's
    length bound is FL004's advice except at Anthropic, which loosens it (FL203)."""
    if provider is None:
        return code != "FL203"
    if provider == "openai":
        return not code.startswith("FL2")
    return not code.startswith("FL1") and code != "FL004"


_Raw = tuple[str, str, str, str]  # code, pointer, message, fix


def _say(code: str, pointer: str, detail: str = "", fix: str | None = None) -> _Raw:
    message, default_fix = CODES[code]
    return code, pointer, f"{message}{detail}", default_fix if fix is None else fix


def _quality(walk: _Walk) -> Iterator[_Raw]:
    for node in walk.nodes:
        schema, pointer = node.schema, node.pointer
        yield from _enum_escape(node)
        types = _types(schema)
        if "string" in types and not _STRING_BOUNDS.intersection(schema):
            yield _say("FL004", pointer)
        if "array" in types and "maxItems" not in schema and schema.get("items") is not False:
            yield _say("FL005", pointer)
        if _is_object(schema):
            yield from _optional_facts(walk, node)
            yield from _reasoning_order(node)


def _enum_escape(node: _Node) -> Iterator[_Raw]:
    values = node.schema.get("enum")
    if node.nullable or not isinstance(values, list) or len(values) < 2:
        return
    if not all(isinstance(value, str) for value in values):
        return
    normalized = {re.sub(r"[\s-]+", "_", value.strip().lower()) for value in values}
    if normalized & ESCAPE_VALUES or any(value.startswith("other") for value in normalized):
        return
    yield _say("FL001", node.pointer, f" ({', '.join(values[:4])}{', ...' * (len(values) > 4)})")


def _optional_facts(walk: _Walk, node: _Node) -> Iterator[_Raw]:
    required = set(_list(node.schema.get("required")))
    for name, raw in _items(node.schema.get("properties")):
        schema = walk.deref(raw)
        if name not in required or not isinstance(schema, dict) or walk.admits_null(raw):
            continue
        types = _types(schema) or {
            kind for branch in _list(schema.get("anyOf")) for kind in _types(walk.deref(branch))
        }
        if not types or not types <= {"string", "integer", "number"}:
            continue
        hint = OPTIONAL_HINT.search(f"{raw.get('description')} {schema.get('description')}")
        word = next((w for w in _words(name) if w in OPTIONAL_FACT_WORDS), None)
        if hint or word:
            why = f"the description says {hint.group(0)!r}" if hint else f"{word!r} in the name"
            fix = f'"type": ["{sorted(types)[0]}", "null"] (null when the source is silent)'
            yield _say("FL002", _join(node.pointer, "properties", name), f" ({why})", fix)


def _reasoning_order(node: _Node) -> Iterator[_Raw]:
    names = [name for name, _ in _items(node.schema.get("properties"))]
    kinds = [_name_kind(name) for name in names]
    for index, name in enumerate(names):
        later = [names[j] for j in range(index + 1, len(names)) if kinds[j] == "reasoning"]
        if kinds[index] == "answer" and later:
            detail = f": {name!r} comes before {later[0]!r}"
            fix = f"move {later[0]!r} before {name!r}: field order is the reasoning budget"
            yield _say("FL003", _join(node.pointer, "properties", name), detail, fix)


def _openai(walk: _Walk) -> Iterator[_Raw]:
    root = walk.deref(walk.root)
    if "object" not in _types(root) or "anyOf" in root:
        yield _say("FL107", "")
    objects: dict[str, int] = {}
    enums: dict[str, int] = {}
    for node in walk.nodes:
        schema, pointer = node.schema, node.pointer
        if _is_object(schema):
            objects[pointer] = len(_items(schema.get("properties")))
            if schema.get("additionalProperties") is not False:
                yield _say("FL102", pointer)
            for name in _optional_names(schema):
                yield _say("FL101", _join(pointer, "properties", name))
            if node.depth == OPENAI_MAX_DEPTH and schema.get("properties"):
                yield _say("FL104", pointer)
        if isinstance(schema.get("enum"), list):
            enums[pointer] = len(schema["enum"])
        for keyword in OPENAI_UNSUPPORTED:
            if keyword in schema:
                yield _say("FL106", pointer, f": {keyword!r}")
    if sum(objects.values()) > OPENAI_MAX_PROPERTIES:
        yield _say("FL103", "", f" ({sum(objects.values())})")
    if sum(enums.values()) > OPENAI_MAX_ENUM_VALUES:
        yield _say("FL105", "", f" ({sum(enums.values())})")


def _anthropic(walk: _Walk) -> Iterator[_Raw]:
    for pointer in dict.fromkeys(walk.cycles):
        yield _say("FL201", pointer)
    unique = {node.pointer: node.schema for node in walk.nodes}
    for pointer, schema in unique.items():
        numeric = [keyword for keyword in NUMERIC_BOUNDS if keyword in schema]
        if numeric:
            yield _say("FL202", pointer, f": {', '.join(numeric)}")
        lengths = [keyword for keyword in ("minLength", "maxLength") if keyword in schema]
        if lengths:
            yield _say("FL203", pointer, f": {', '.join(lengths)}")
        if schema.get("minItems") not in (None, 0, 1):
            yield _say("FL204", pointer, f" (minItems {schema['minItems']})")
        if _is_object(schema):
            yield from _anthropic_object(schema, pointer)
    objects = [schema for schema in unique.values() if _is_object(schema)]
    optional = sum(len(list(_optional_names(schema))) for schema in objects)
    if optional > ANTHROPIC_MAX_OPTIONAL:
        yield _say("FL207", "", f" ({optional})")
    unions = sum(
        _is_union(child) for schema in objects for _, child in _items(schema.get("properties"))
    )
    if unions > ANTHROPIC_MAX_UNIONS:
        yield _say("FL208", "", f" ({unions})")


def _anthropic_object(schema: dict[str, Any], pointer: str) -> Iterator[_Raw]:
    if schema.get("additionalProperties") is not False:
        yield _say("FL205", pointer)
    names = [name for name, _ in _items(schema.get("properties"))]
    optional = set(_optional_names(schema))
    for index, name in enumerate(names):
        if name in optional and any(later not in optional for later in names[index + 1 :]):
            yield _say("FL206", _join(pointer, "properties", name))


def _children(schema: dict[str, Any], pointer: str) -> Iterator[tuple[Any, str, bool, bool]]:
    """(subschema, its pointer, whether a property value, whether an anyOf/oneOf branch)
    for every subschema an instance can be checked against."""
    for keyword in _PROPERTY_KEYWORDS:
        for name, child in _items(schema.get(keyword)):
            yield child, _join(pointer, keyword, name), True, False
    if isinstance(schema.get("additionalProperties"), dict):
        yield schema["additionalProperties"], f"{pointer}/additionalProperties", True, False
    for name, child in _items(schema.get("dependentSchemas")):
        yield child, _join(pointer, "dependentSchemas", name), False, False
    for keyword in _VALUE_KEYWORDS:
        if isinstance(schema.get(keyword), dict):
            yield schema[keyword], f"{pointer}/{keyword}", False, False
    for keyword in _LIST_KEYWORDS:
        for index, child in enumerate(_list(schema.get(keyword))):
            yield child, f"{pointer}/{keyword}/{index}", False, keyword in ("anyOf", "oneOf")


def _types(schema: Any) -> set[str]:
    declared = schema.get("type") if isinstance(schema, dict) else None
    names = declared if isinstance(declared, list) else [declared]
    return {name for name in names if isinstance(name, str)}


def _is_object(schema: dict[str, Any]) -> bool:
    return "object" in _types(schema) or isinstance(schema.get("properties"), dict)


def _is_union(schema: Any) -> bool:
    return isinstance(schema, dict) and (
        len(_types(schema)) > 1 or bool({"anyOf", "oneOf"} & set(schema))
    )


def _optional_names(schema: dict[str, Any]) -> Iterator[str]:
    required = set(_list(schema.get("required")))
    return (name for name, _ in _items(schema.get("properties")) if name not in required)


def _name_kind(name: str) -> str | None:
    words = _words(name)
    if REASONING_WORDS.intersection(words):
        return "reasoning"
    if ANSWER_WORDS.intersection(words) or (words and words[0] == "final"):
        return "answer"
    return None


def _words(name: str) -> list[str]:
    """``"final_answerText"`` -> ``["final", "answer", "text"]``."""
    return [word.lower() for word in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+", name)]


def _items(value: Any) -> list[tuple[str, Any]]:
    return list(value.items()) if isinstance(value, dict) else []


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _join(pointer: str, *names: str) -> str:
    return pointer + "".join(f"/{name.replace('~', '~0').replace('/', '~1')}" for name in names)
