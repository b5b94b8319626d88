"""Surface-form tolerance for numbers: let the model spell a number its own way, then coerce.

A small model forced onto digits where it wanted words writes another number: SmolLM2 reads
"Ada Lovelace was thirty-six" and, made to write an integer, writes ``306``. With
``numbers="tolerant"`` every ``integer`` / ``number`` subschema (without ``enum`` or
``const``) also admits a short string of digits and words (:data:`NUMBER_TEXT`), so
``"age": "thirty-six"`` or ``"age": "34"`` can be written; after decoding,
:func:`coerce_numbers` turns such strings back into the number they state (digits or English
number words, :func:`formline.pipeline.grounding.extract_numbers`) and reports the paths it
coerced. A string that states no single number is left as it is, so the after-check against
the schema as given refuses it: never a silent guess.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import jsonschema
from referencing.exceptions import Unresolvable

from formline.pipeline.grounding import NUMBER_WORDS, WORD, extract_numbers

NUMERIC_TYPES = ("integer", "number")
# Digits and words, a sign, separators; 40 characters bound the string (a model that rambles
# in an unbounded string runs into max_tokens instead of answering).
NUMBER_TEXT = r"^[+-]?[0-9A-Za-z][0-9A-Za-z ,.'-]{0,39}$"
PLAIN_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
# Commas between groups of three digits, and no point: thousands ("12,000" is 12000; read
# as a decimal comma it was 12, coerced into an integer field with confidence 1.0).
COMMA_THOUSANDS = re.compile(r"^[+-]?[1-9]\d{0,2}(,\d{3})+$")  # "0,500" is a decimal comma
# A spelled number's characters: NUMBER_TEXT's ("5%" or "12B" is not a number).
SPELLED_CHARACTERS = re.compile(r"[+-]?[0-9A-Za-z ,.'-]+")
SIGN_WORDS = frozenset({"minus", "negative"})
MAX_EXPONENT = 308  # a float's range: past it a spelled value is no number a field holds


def map_subschemas(schema: Any, change: Callable[[dict[str, Any]], dict[str, Any]]) -> Any:
    """A copy of ``schema`` with ``change`` applied to every subschema (post-order); the
    keys of ``properties``, ``$defs`` and ``patternProperties`` are names, not keywords."""
    if isinstance(schema, list):
        return [map_subschemas(item, change) for item in schema]
    if not isinstance(schema, dict):
        return copy.deepcopy(schema)
    result: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ("properties", "$defs", "definitions", "patternProperties") and isinstance(
            value, dict
        ):
            result[key] = {name: map_subschemas(sub, change) for name, sub in value.items()}
        elif isinstance(value, dict | list) and key not in ("enum", "const", "default"):
            result[key] = map_subschemas(value, change)
        else:
            result[key] = copy.deepcopy(value)
    return change(result)


def _numeric_kind(schema: dict[str, Any]) -> str | None:
    kind = schema.get("type")
    return kind if kind in NUMERIC_TYPES else None


def _tolerate(node: dict[str, Any]) -> dict[str, Any]:
    if _numeric_kind(node) is None or "enum" in node or "const" in node:
        return node
    spelled = {"type": "string", "pattern": NUMBER_TEXT}
    return {"anyOf": [node, spelled]}


def tolerant_schema(schema: Any) -> Any:
    """``schema`` with every plain ``integer`` / ``number`` subschema also admitting a
    spelled number (``{"anyOf": [original, string of NUMBER_TEXT]}``). The input is
    unchanged. Costs one walk of the schema."""
    if not isinstance(schema, dict):
        return schema
    return map_subschemas(schema, _tolerate)


def without_separators(text: str) -> str:
    """``text`` with its digit groups' separators resolved to Python's spelling: "1,250.5"
    and "1.250,5" -> "1250.5", "12,000" -> "12000", "49,90" -> "49.90" (a comma before
    three digits groups thousands; before one, two or four it is a decimal comma)."""
    if text.rfind(",") > text.rfind(".") >= 0:  # "1.250,5": points group thousands
        return text.replace(".", "").replace(",", ".")
    if "." in text or COMMA_THOUSANDS.match(text):
        return text.replace(",", "")
    return text.replace(",", ".")


def read_number(text: str, integer: bool) -> int | float | None:
    """The one number ``text`` states, all of it a number (``"34"``, ``"thirty-six"``,
    ``"minus five"``, ``"1,250.5"``), or ``None`` when it states none or several, holds other
    words (``"second"``, ``"5 kg"``), or is past a float's range. ``integer``: only a whole
    number counts. Costs one pass over ``text``."""
    cleaned = text.strip()
    plain = without_separators(cleaned)
    if PLAIN_NUMBER.match(plain):
        found = Decimal(plain)
    else:
        spelled = _read_spelled(cleaned)
        if spelled is None:
            return None
        found = spelled
    # "1e99999999" is ten characters of NUMBER_TEXT; as an int it took minutes to build.
    if found and found.adjusted() > MAX_EXPONENT:
        return None
    if found == found.to_integral_value():
        return int(found)
    return None if integer else float(found)


def _read_spelled(text: str) -> Decimal | None:
    """The number ``text`` spells in words and digits (a leading ``-``, "minus" or
    "negative" its sign), or ``None`` if it holds any other word or character."""
    words = [word.lower() for word in WORD.findall(text)]
    signed = bool(words) and words[0] in SIGN_WORDS
    if signed:  # "minus five": the rest is the number (unsigned: "minus -5" states none)
        words, text = words[1:], text.split(maxsplit=1)[-1]
        if text[:1] in "+-":
            return None
    if not SPELLED_CHARACTERS.fullmatch(text) or any(w not in NUMBER_WORDS for w in words):
        return None
    values = set(extract_numbers(text))
    if len(values) != 1:
        return None
    found = values.pop()
    return -found if signed or text.startswith("-") else found


class _Coercion:
    def __init__(self, root: dict[str, Any]):
        self.root = root
        self.coerced: list[str] = []
        self.validator = jsonschema.validators.validator_for(root)(root)

    def is_valid(self, value: Any, schema: dict[str, Any]) -> bool:
        """Whether ``value`` already fits ``schema`` (``$ref`` read from the root); a schema
        the validator cannot read counts as not fitting (the after-check names it)."""
        try:
            return bool(self.validator.evolve(schema=schema).is_valid(value))
        except (Unresolvable, RecursionError, ValueError, re.error):  # as schema/api.py
            return False

    def resolve(self, schema: Any) -> Any:
        reference = schema.get("$ref") if isinstance(schema, dict) else None
        if not isinstance(reference, str) or not reference.startswith("#/"):
            return schema
        node: Any = self.root
        for part in reference[2:].split("/"):
            if not isinstance(node, dict) or part not in node:
                return schema
            node = node[part]
        return self.resolve(node)

    def walk(self, value: Any, schema: Any, path: str) -> Any:
        schema = self.resolve(schema)
        if not isinstance(schema, dict):
            return value
        # A string the schema as given takes ("12B" where anyOf has a string branch) is the
        # model's value, not a spelled number.
        if isinstance(value, str) and self.is_valid(value, schema):
            return value
        kind = _numeric_kind(schema)
        if kind is not None and isinstance(value, str):
            number = read_number(value, kind == "integer")
            if number is None:
                return value
            self.coerced.append(path or "the value")
            return number
        for branch in schema.get("anyOf", []) + schema.get("oneOf", []) + schema.get("allOf", []):
            value = self.walk(value, branch, path)
        if isinstance(value, list) and isinstance(schema.get("items"), dict):
            return [
                self.walk(item, schema["items"], f"{path}[{i}]") for i, item in enumerate(value)
            ]
        properties = schema.get("properties")
        if isinstance(value, dict) and isinstance(properties, dict):
            return {
                key: self.walk(item, properties[key], f"{path}.{key}" if path else key)
                if key in properties
                else item
                for key, item in value.items()
            }
        return value


def coerce_numbers(value: Any, schema: Any) -> tuple[Any, list[str]]:
    """``value`` with every string where ``schema`` (the schema as given, not the tolerant
    one) wants an integer or a number replaced by the number it states, and the JSON paths
    so coerced (``"age"``, ``"items[0].price"``). Follows ``properties``, ``items``,
    ``anyOf``/``oneOf``/``allOf`` and local ``$ref``. Costs one walk of the value."""
    if not isinstance(schema, dict):
        return value, []
    coercion = _Coercion(schema)
    result = coercion.walk(value, schema, "")
    return result, list(dict.fromkeys(coercion.coerced))
