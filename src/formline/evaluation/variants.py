"""The variants of the free-vs-constrained experiment: how each one changes the schema, the
prompt and the value, before and after decoding.

A :class:`Variant` is data: the decoding mode (``free``, ``constrained`` or ``repair``),
whether the schema is described in the prompt, a schema transform (string-typed numbers,
free-text fields first or last), whether a one-shot example of the target format goes in the
prompt, and whether numbers written as strings are coerced back. The example is built from
the schema alone (:func:`example_instance`), never from a task's gold.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from formline.pipeline.extract import DEFAULT_INSTRUCTION
from formline.pipeline.tolerance import map_subschemas, without_separators

NUMERIC_TYPES = ("integer", "number")
NUMERIC_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
# Free-text fields the model writes its evidence or reasoning in (not the answer itself).
EVIDENCE_NAME = re.compile(
    r"summary|rationale|reason|content|description|explanation|evidence|notes?$|comment",
    re.IGNORECASE,
)
PRETTY = 16  # whitespace bytes between JSON tokens: a newline and 14 spaces of indent
THINK = 48  # free tokens before the answer
EXAMPLE_STRING = "..."
EXAMPLE_DATE = "2024-01-31"
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


@dataclass(frozen=True)
class Variant:
    """One column of the experiment."""

    name: str
    mode: str = "constrained"  # "free", "constrained" or "repair"
    describe_schema: bool | str = False  # True/"schema", "fields", "auto", False
    one_shot: bool = False
    string_typed: bool = False
    order: str | None = None  # "evidence-first", "answer-first" or None (the schema's)
    whitespace: int | None = None  # JSON whitespace bytes allowed between tokens
    numbers: str = "strict"  # "tolerant": spelled numbers admitted, coerced after
    think: int = 0  # free tokens before the answer
    # The instruction ``formline.extract`` uses when given none, instead of the task's own
    # (which names the fields): what a user who passes only a model gets.
    generic_instruction: bool = False
    verbatim: bool = False  # plain strings and numbers narrowed to the prompt's
    help: str = ""

    def generation_options(self) -> dict[str, Any]:
        """The keyword arguments of :func:`formline.generate` this variant sets."""
        return {
            "describe_schema": self.describe_schema,
            "whitespace": self.whitespace,
            "numbers": self.numbers,
            "think": self.think,
            "verbatim": self.verbatim,
        }

    def decoding_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        """The schema the decoder (and the prompt) sees."""
        result = string_typed_schema(schema) if self.string_typed else schema
        if self.order is not None:
            result = reorder_properties(result, evidence_first=self.order == "evidence-first")
        return result

    def prompt(self, task: dict[str, Any], schema: dict[str, Any]) -> str:
        """Instruction, text and, for one-shot, an example of the target format."""
        instruction = DEFAULT_INSTRUCTION if self.generic_instruction else task["instruction"]
        prompt = f"{instruction}\n\n{task['text']}"
        if self.one_shot:
            example = json.dumps(example_instance(schema), ensure_ascii=False)
            prompt += (
                "\n\nReply with JSON only, in exactly this format (the values are "
                f"placeholders):\n{example}"
            )
        return prompt

    def finish(self, value: Any, schema: dict[str, Any]) -> Any:
        """The value in the original schema's types (string-typed numbers coerced back)."""
        return coerce_numbers(value, schema) if self.string_typed else value


VARIANTS: dict[str, Variant] = {
    variant.name: variant
    for variant in (
        Variant("free", mode="free", describe_schema=True, help="no mask, schema in the prompt"),
        Variant("constrained", help="mask only, schema not described"),
        Variant("constrained+described", describe_schema=True, help="mask + schema in prompt"),
        Variant("constrained+one-shot", one_shot=True, help="mask + an example of the format"),
        Variant("string-typed", string_typed=True, help="numbers as strings, coerced after"),
        Variant("evidence-first", order="evidence-first", help="free-text fields first"),
        Variant("answer-first", order="answer-first", help="free-text fields last"),
        Variant("repair", mode="repair", describe_schema=True, help="constrained + repair loop"),
        Variant(
            "extract", mode="repair", generic_instruction=True, verbatim=True,
            help="formline.extract as a user calls it: its defaults, its repair loop",
        ),
        Variant("pretty", whitespace=PRETTY, help="JSON indented as the model likes"),
        Variant(
            "pretty+described", whitespace=PRETTY, describe_schema=True,
            help="indented, schema in prompt",
        ),
        Variant(
            "pretty+fields", whitespace=PRETTY, describe_schema="fields",
            help="indented, field list in prompt",
        ),
        Variant(
            "pretty+tolerant", whitespace=PRETTY, numbers="tolerant",
            help="indented, spelled numbers coerced",
        ),
        Variant(
            "pretty+fields+tolerant", whitespace=PRETTY, describe_schema="fields",
            numbers="tolerant", help="indented, field list, spelled numbers",
        ),
        Variant("pretty+think", whitespace=PRETTY, think=THINK, help="free rationale first"),
        Variant(
            "pretty+fields+tolerant+think", whitespace=PRETTY, describe_schema="fields",
            numbers="tolerant", think=THINK, help="field list, spelled numbers, rationale",
        ),
        Variant(
            "pretty+evidence-first", whitespace=PRETTY, order="evidence-first",
            help="indented, free-text fields first",
        ),
        Variant(
            "pretty+string-typed", whitespace=PRETTY, string_typed=True,
            help="indented, numbers as strings",
        ),
        Variant(
            "pretty+verbatim", whitespace=PRETTY, verbatim=True,
            help="indented, values narrowed to the text's spans and numbers",
        ),
        Variant(
            "generic+verbatim", whitespace=PRETTY, generic_instruction=True, verbatim=True,
            help="extract's instruction, values narrowed to the text's",
        ),
        Variant(
            "generic+verbatim+think", whitespace=PRETTY, generic_instruction=True,
            verbatim=True, think=THINK, help="extract's default, a free rationale first",
        ),
        Variant(
            "pretty+verbatim+evidence-first", whitespace=PRETTY, verbatim=True,
            order="evidence-first", help="values narrowed to the text's, free text first",
        ),
        Variant(
            "generic", whitespace=PRETTY, generic_instruction=True,
            help="extract's own instruction, not the task's",
        ),
        Variant(
            "generic+fields", whitespace=PRETTY, generic_instruction=True,
            describe_schema="fields", help="extract's instruction, field list",
        ),
        Variant(
            "pretty+auto", whitespace=PRETTY, describe_schema="auto",
            help="field list when the prompt does not name the fields",
        ),
        Variant(
            "generic+auto", whitespace=PRETTY, generic_instruction=True, describe_schema="auto",
            help="extract's instruction, field list when unnamed",
        ),
    )
}  # fmt: skip
# Fits 10 minutes on 2 cores for the 72 dev tasks with the embedded model (one thread).
DEFAULT_VARIANTS = ("free", "constrained", "constrained+one-shot", "string-typed")


def parse_variants(text: str | None) -> list[Variant]:
    """Variants from a comma-separated list (``None``: the default set, ``all``: every one).

    Raises ValueError for an unknown name, or a list that names none (``,`` loaded the model
    and ended in a matplotlib traceback).
    """
    if not text:
        return [VARIANTS[name] for name in DEFAULT_VARIANTS]
    names = list(VARIANTS) if text.strip() == "all" else [n.strip() for n in text.split(",")]
    unknown = [name for name in names if name and name not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variant(s) {unknown}; known: {', '.join(VARIANTS)}")
    chosen = [VARIANTS[name] for name in dict.fromkeys(names) if name]
    if not chosen:
        raise ValueError(f"--variants {text!r} names no variant; known: {', '.join(VARIANTS)}")
    return chosen


def _map_schemas(schema: Any, change: Callable[[dict[str, Any]], None]) -> Any:
    """A copy of ``schema`` with ``change`` applied in place to every subschema (post-order;
    see :func:`formline.pipeline.tolerance.map_subschemas`)."""

    def changed(node: dict[str, Any]) -> dict[str, Any]:
        change(node)
        return node

    return map_subschemas(schema, changed)


def _retype_numbers(node: dict[str, Any]) -> None:
    kind = node.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    if not any(entry in NUMERIC_TYPES for entry in kinds):
        return
    retyped = list(dict.fromkeys("string" if k in NUMERIC_TYPES else k for k in kinds))
    node["type"] = retyped if isinstance(kind, list) else retyped[0]
    for keyword in NUMERIC_KEYWORDS:
        node.pop(keyword, None)


def string_typed_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with every integer or number type written as a string type (numeric
    bounds dropped); :func:`coerce_numbers` turns the answers back. The input is unchanged."""
    result: dict[str, Any] = _map_schemas(schema, _retype_numbers)
    return result


def to_number(text: str, integer: bool) -> int | float | str:
    """``"42"`` -> 42, ``" 49.90 "`` -> 49.9, ``"1,250.5"`` -> 1250.5, ``"75,000"`` -> 75000
    (:func:`~formline.pipeline.tolerance.without_separators`: it read 75.0, and invoice-04's
    right answers scored wrong); anything else is returned unchanged (it then scores as a
    wrong type, as it should)."""
    cleaned = without_separators(text.strip())
    if not _NUMBER.match(cleaned):
        return text
    number = float(cleaned)
    if number.is_integer() and (integer or "." not in cleaned):
        return int(number)
    return number


def _numeric_kind(schema: dict[str, Any]) -> str | None:
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    for entry in NUMERIC_TYPES:
        if entry in kinds:
            return entry
    return None


def coerce_numbers(value: Any, schema: Any) -> Any:
    """``value`` with strings converted to numbers wherever ``schema`` (the original, not
    the string-typed one) wants an integer or a number. Follows ``properties``, ``items``
    and ``oneOf``/``anyOf`` branches (every branch's numeric properties); other values are
    returned as they are."""
    if not isinstance(schema, dict):
        return value
    kind = _numeric_kind(schema)
    if kind is not None and isinstance(value, str):
        return to_number(value, kind == "integer")
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [coerce_numbers(item, schema["items"]) for item in value]
    if isinstance(value, dict):
        for branch in schema.get("oneOf", []) + schema.get("anyOf", []):
            value = coerce_numbers(value, branch)
        properties = schema.get("properties", {})
        return {
            key: coerce_numbers(item, properties[key]) if key in properties else item
            for key, item in value.items()
        }
    return value


def is_evidence_field(name: str, schema: Any) -> bool:
    """A free-text field: a plain string (no enum, const, format or pattern) whose name
    says summary, rationale, reason, content, description, ..."""
    if not isinstance(schema, dict) or schema.get("type") != "string":
        return False
    if any(keyword in schema for keyword in ("enum", "const", "format", "pattern")):
        return False
    return bool(EVIDENCE_NAME.search(name))


def _reorder(node: dict[str, Any], evidence_first: bool) -> None:
    properties = node.get("properties")
    if not isinstance(properties, dict):
        return
    evidence = [key for key, sub in properties.items() if is_evidence_field(key, sub)]
    answers = [key for key in properties if key not in evidence]
    order = evidence + answers if evidence_first else answers + evidence
    node["properties"] = {key: properties[key] for key in order}
    if isinstance(node.get("required"), list):
        node["required"] = [key for key in order if key in node["required"]]


def reorder_properties(schema: dict[str, Any], evidence_first: bool) -> dict[str, Any]:
    """``schema`` with every object's free-text fields (:func:`is_evidence_field`) moved
    before (evidence-first) or after (answer-first) the others; relative order is kept.
    The grammar writes properties in the declared order, so this is the generation order."""
    result: dict[str, Any] = _map_schemas(schema, lambda node: _reorder(node, evidence_first))
    return result


def example_instance(schema: Any) -> Any:
    """A small valid instance of ``schema`` with placeholder values: the first enum value or
    branch, the minimum of a number, ``"..."`` for a string (an ISO date for format date),
    ``minItems`` (at least one) array items, every declared property. Supports the keywords
    of ordinary extraction schemas (type, enum, const, properties, items, oneOf/anyOf,
    minimum, minItems, format date); local ``$ref`` and the rest are not followed."""
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    branches = schema.get("oneOf") or schema.get("anyOf")
    if branches:
        return example_instance(branches[0])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((entry for entry in kind if entry != "null"), "null")
    return _example_of_type(kind, schema)


def _example_of_type(kind: Any, schema: dict[str, Any]) -> Any:
    if kind == "object" or "properties" in schema:
        properties = schema.get("properties", {})
        return {key: example_instance(sub) for key, sub in properties.items()}
    if kind == "array":
        count = max(1, int(schema.get("minItems", 1)))
        return [example_instance(schema.get("items", {})) for _ in range(count)]
    if kind in NUMERIC_TYPES:
        low = schema.get("minimum", schema.get("exclusiveMinimum", 0))
        number = max(1, int(low) + (1 if "exclusiveMinimum" in schema else 0))
        return number if kind == "integer" else float(number)
    if kind == "boolean":
        return False
    if kind == "string":
        return EXAMPLE_DATE if schema.get("format") == "date" else EXAMPLE_STRING
    return None
