"""Soundness of the schema compiler as a property, over a few hundred schemas.

Schemas: the extraction-dev set (with its tasks' gold values), every ``MASKBENCH_STEP``-th
file of the MaskBench sample (with its tests) and small schemas drawn by
:func:`schema_strategy`. For every schema that compiles:

- valid instances (drawn by ``hypothesis-jsonschema``, shipped with the data, or mutations
  that stayed valid) must be accepted along their canonical tokenization up to termination
  (EOS accepted, matcher terminated);
- mutations of those (a wrong type, a value past a bound, a string changed at an end or cut
  to a length bound, a key dropped or added, an item added or dropped) that the oracle
  refuses must be refused somewhere along their tokenization when the report says one of
  the keywords they violate is enforced (:class:`Classifier`); a mutation that violates only
  keywords reported checked-after (or unsupported, or ignored) is not walked.

The oracle (:func:`oracle`) is what :meth:`CompiledSchema.check` runs (jsonschema, the
schema's draft, its format checker) with three corrections, so that only formline's real
divergences show: ECMA-262 regexes for ``pattern``/``patternProperties`` (Python's ``re``
takes ``١`` for ``\\d`` and lets ``$`` match before a final newline), formline's documented
format narrowings (:data:`NARROWER`), and exact decimals when a counterexample depends on
jsonschema's float comparisons (:func:`exact_is_valid`).

The text walked is :meth:`CompiledSchema.serialize` (compact JSON, the schema's property
order) as the vocabulary's tokenizer encodes it (:class:`Tokenizer`). Every count is kept in
:class:`Tally`; :func:`run_all` runs everything and ``Tally.summary()`` gives the figures.
The drawn examples (and the generated schemas) are read from a store
(``soundness_examples.py``), so the counts are the same on every machine. Run alone, or
store the examples anew (after changing a schema source, ``EXAMPLES`` or the strategy)::

    PYTHONPATH=src python3 tests/schema/soundness.py
    PYTHONPATH=src python3 tests/schema/soundness.py --store-examples

Known formline bugs would be listed in :data:`KNOWN_BUGS` (each with its own strict-xfail
test in ``test_schema_soundness.py``): a counterexample they match is counted, not failed.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import random
import re
import select
import signal
import sys
import time
import warnings
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from soundness_examples import (
    STORE_BUDGET_S,
    ExampleStore,
    Stored,
    load_store,
    schema_key,
    write_store,
)

ROOT = Path(__file__).resolve().parents[2]
MASKBENCH = ROOT / "tests" / "data" / "maskbench"

# Budgets. The run reads its hypothesis-jsonschema examples from the store
# (soundness_examples.py), drawn once within STORE_BUDGET_S a schema, so its counts are the
# same on every machine: drawing live within the wall-clock budgets below made them depend
# on the machine's speed (949 valid instances drawn here, 772 on CI). The budgets below
# serve only a schema the store lacks, drawn live and counted as such.
MASKBENCH_STEP = 4  # every 4th MaskBench file by sorted name: 75 of the 300
GENERATED_SCHEMAS = 180  # drawn; about 140 distinct
EXAMPLES = {"extraction-dev": 10, "maskbench": 4, "generated": 6}  # per schema, at most
GENERATION_BUDGET_S = {"extraction-dev": 2.0, "maskbench": 2.0, "generated": 1.2}  # hard stops
MUTATIONS_PER_INSTANCE = 6  # verified-invalid mutations walked per valid instance, at most
MUTATION_ATTEMPTS = 40  # candidates drawn (and validated) per valid instance
MAX_TEXT_BYTES = 20_000  # longer serializations are not walked (counted)


# --- drawing examples from a strategy, deterministically ------------------------------------


def draw_examples(
    strategy: Any, count: int, emit: Callable[[Any], None] | None = None
) -> list[Any]:
    """Up to ``count`` distinct examples of ``strategy``, the same on every run.

    Derandomized (the seed comes from the function), no example database, generation phase
    only (no shrinking). ``too_slow`` and ``large_base_example`` are suppressed: both are only
    about slow generation. The other health checks (``filter_too_much``, ``data_too_large``)
    raise ``FailedHealthCheck``, which callers count as a reason hypothesis-jsonschema cannot
    generate. ``emit`` is called with each new example as it comes.
    """
    from hypothesis import HealthCheck, Phase, Verbosity, given, settings

    drawn: list[Any] = []
    seen: set[str] = set()

    @settings(
        max_examples=count,
        derandomize=True,
        database=None,
        phases=[Phase.generate],
        deadline=None,
        verbosity=Verbosity.quiet,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.large_base_example],
    )
    @given(strategy)
    def collect(value: Any) -> None:
        key = json.dumps(value, sort_keys=True, default=repr)
        if key not in seen:
            seen.add(key)
            drawn.append(copy.deepcopy(value))
            if emit is not None:
                emit(value)

    collect()
    return drawn


def _generate_here(schema: Any, count: int) -> tuple[list[Any], str | None]:
    from hypothesis_jsonschema import from_schema

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return draw_examples(from_schema(schema, custom_formats=custom_formats()), count), None
    except Exception as error:  # every failure to generate is a counted reason
        return [], f"{type(error).__name__}: {_first_words(error)}"


@cache
def _warm_up() -> None:
    """Import hypothesis-jsonschema and run hypothesis once in this process, so that every
    forked child starts warm (a cold first run costs 0.2 s, a warm one 0.01 s)."""
    from hypothesis_jsonschema import from_schema

    draw_examples(from_schema({"type": "object", "properties": {"a": {"type": "string"}}}), 2)


def generate_with_budget(schema: Any, count: int, budget_s: float) -> tuple[list[Any], str | None]:
    """hypothesis-jsonschema's examples of ``schema``, drawn in a forked child that is killed
    after ``budget_s`` seconds (a single draw can take minutes on some schemas, and nothing
    interrupts it cleanly in-process). Returns the examples the child sent, and why it
    stopped early (``None``: it drew all it could)."""
    if not hasattr(os, "fork"):  # no fork (Windows): in-process, without the hard stop
        return _generate_here(schema, count)
    _warm_up()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one JSON line per example, then "done" or the error
        os.close(read_end)
        out = os.fdopen(write_end, "w", encoding="utf-8")
        try:
            from hypothesis_jsonschema import from_schema

            def emit(value: Any) -> None:
                out.write(json.dumps({"example": value}) + "\n")
                out.flush()

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                strategy = from_schema(schema, custom_formats=custom_formats())
                draw_examples(strategy, count, emit)
            out.write(json.dumps({"done": True}) + "\n")
        except BaseException as error:  # every failure to generate is a counted reason
            out.write(json.dumps({"error": f"{type(error).__name__}: {_first_words(error)}"}))
            out.write("\n")
        finally:
            out.flush()
            os._exit(0)
    os.close(write_end)
    examples: list[Any] = []
    reason: str | None = f"over the {budget_s:g} s generation budget"
    deadline = time.monotonic() + budget_s
    buffer = b""
    with os.fdopen(read_end, "rb", buffering=0) as pipe:
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([pipe], [], [], left)
            if not ready:
                continue
            chunk = pipe.read(1 << 16)
            if not chunk:
                reason = "the generating child died"
                break
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            finished = False
            for line in lines:
                message = json.loads(line)
                if "example" in message:
                    examples.append(message["example"])
                else:
                    reason = message.get("error")
                    finished = True
            if finished:
                break
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return examples, reason


# --- the schemas --------------------------------------------------------------------------


@dataclass
class Case:
    """One schema and the instances its source ships (``valid``/``invalid`` as the source
    says; each is re-checked with ``jsonschema``)."""

    source: str  # extraction-dev, maskbench, generated
    label: str  # file name or generated index
    schema: Any
    shipped: list[tuple[Any, bool]] = field(default_factory=list)


def extraction_dev_cases() -> list[Case]:
    """The six extraction-dev schemas, each with the gold values of its tasks."""
    from formline.evaluation.dataset import extraction_dev_directory

    directory = extraction_dev_directory()
    cases = {
        path.name: Case("extraction-dev", path.name, json.loads(path.read_text(encoding="utf-8")))
        for path in sorted((directory / "schemas").glob("*.json"))
    }
    for line in (directory / "tasks.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            task = json.loads(line)
            cases[task["schema"]].shipped.append((task["gold"], True))
    return list(cases.values())


def maskbench_cases(step: int = MASKBENCH_STEP) -> list[Case]:
    """Every ``step``-th MaskBench file by sorted name, with its valid and invalid tests."""
    cases = []
    for path in sorted(MASKBENCH.glob("*.json"))[::step]:
        document = json.loads(path.read_text(encoding="utf-8"))
        shipped = [(test["data"], bool(test["valid"])) for test in document["tests"]]
        cases.append(Case("maskbench", path.name, document["schema"], shipped))
    return cases


KEYS = ["a", "b", "name", "id", "x y", "é", "k_1", 'q"t']
PATTERNS = [
    r"^[a-z]+$",
    r"^\d{3}-\d{4}$",
    r"^(foo|bar)$",
    r"ab",
    r"^[A-Z][a-z]*$",
    r"^\w+$",
    r"^.{2,5}$",
    r"[0-9]$",
    r"^\S+$",
    r"^(?:[0-9a-f]{2})+$",
    r"^a*b?c+$",
    r"^[^x]*$",
    r"^-?\d+(\.\d+)?$",
]
FORMATS = [
    "date",
    "time",
    "date-time",
    "duration",
    "email",
    "ipv4",
    "ipv6",
    "uuid",
    "hostname",
    "uri",
]


def schema_strategy() -> Any:
    """Small JSON Schemas: types, properties/required/additionalProperties/propertyNames/
    minProperties/maxProperties, enum/const (scalars, small arrays and objects), minimum/
    maximum (inclusive, exclusive, fractional bounds on integers), multipleOf, minLength/
    maxLength, pattern, format, items/prefixItems/minItems/maxItems/uniqueItems/contains,
    anyOf/oneOf/allOf/not and a $ref into $defs; at most a few levels deep."""
    from hypothesis import strategies as st

    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-50, 50),
        st.sampled_from([0.5, -2.25, 0.001, 100.0, 1e20, -0.0, 1.0]),
        st.text(alphabet='abcé "\\\n', max_size=4),
    )
    small_values = st.one_of(
        scalars,
        st.lists(scalars, max_size=2),
        st.dictionaries(st.sampled_from(KEYS), scalars, max_size=2),
    )

    @st.composite
    def bounds(draw: Any, values: Any) -> dict[str, Any]:
        low, high = sorted([draw(values), draw(values)])
        keywords: dict[str, Any] = {}
        if draw(st.booleans()):
            keywords["exclusiveMinimum" if draw(st.booleans()) else "minimum"] = low
        if draw(st.booleans()):
            keywords["exclusiveMaximum" if draw(st.booleans()) else "maximum"] = high
        return keywords

    @st.composite
    def lengths(draw: Any, low_name: str, high_name: str) -> dict[str, Any]:
        low, high = sorted([draw(st.integers(0, 6)), draw(st.integers(0, 6))])
        keywords: dict[str, Any] = {}
        if draw(st.booleans()):
            keywords[low_name] = low
        if draw(st.booleans()):
            keywords[high_name] = high
        return keywords

    def typed(kind: str, extra: Any) -> Any:
        return extra.map(lambda keywords: {"type": kind, **keywords})

    decimals = st.decimals(-1000, 1000, places=2).map(float)
    integer_bounds = st.one_of(st.integers(-1000, 1000), st.sampled_from([-0.5, 2.5, 1e3]))
    multiple = st.sampled_from([{}, {}, {}, {"multipleOf": 3}, {"multipleOf": 0.5}])
    integer = st.tuples(bounds(integer_bounds), multiple).map(lambda t: {**t[0], **t[1]})
    number = st.tuples(bounds(decimals), multiple).map(lambda t: {**t[0], **t[1]})
    leaves = st.one_of(
        typed("integer", integer),
        typed("number", number),
        typed("string", lengths("minLength", "maxLength")),
        st.sampled_from(PATTERNS).map(lambda p: {"type": "string", "pattern": p}),
        st.sampled_from(FORMATS).map(lambda f: {"type": "string", "format": f}),
        st.sampled_from([{"type": "boolean"}, {"type": "null"}, {}]),
        st.lists(small_values, min_size=1, max_size=4, unique_by=json.dumps).map(
            lambda v: {"enum": v}
        ),
        small_values.map(lambda v: {"const": v}),
        st.lists(
            st.sampled_from(["integer", "string", "null", "boolean", "number"]),
            min_size=2,
            max_size=3,
            unique=True,
        ).map(lambda t: {"type": t}),
    )

    def containers(children: Any) -> Any:
        @st.composite
        def an_object(draw: Any) -> dict[str, Any]:
            names = draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=4, unique=True))
            schema: dict[str, Any] = {
                "type": "object",
                "properties": {name: draw(children) for name in names},
            }
            required = [name for name in names if draw(st.booleans())]
            if required:
                schema["required"] = required
            extra = draw(st.sampled_from(["absent", "false", "true", "schema", "absent"]))
            if extra == "false":
                schema["additionalProperties"] = False
            elif extra == "true":
                schema["additionalProperties"] = True
            elif extra == "schema":
                schema["additionalProperties"] = {"type": "integer"}
            schema.update(
                draw(lengths("minProperties", "maxProperties")) if draw(st.booleans()) else {}
            )
            names_schema = draw(
                st.sampled_from([None, None, None, {"maxLength": 3}, {"pattern": "^[a-z]"}])
            )
            if names_schema is not None:
                schema["propertyNames"] = names_schema
            return schema

        @st.composite
        def an_array(draw: Any) -> dict[str, Any]:
            schema: dict[str, Any] = {"type": "array"}
            if draw(st.integers(0, 3)) == 0:
                schema["prefixItems"] = draw(st.lists(children, min_size=1, max_size=2))
                schema["items"] = draw(st.one_of(st.just(False), children))
            else:
                schema["items"] = draw(children)
            schema.update(draw(lengths("minItems", "maxItems")))
            if draw(st.integers(0, 4)) == 0:
                schema["uniqueItems"] = True
            if draw(st.integers(0, 5)) == 0:
                schema["contains"] = draw(children)
            return schema

        two_or_three = st.lists(children, min_size=2, max_size=3)
        return st.one_of(
            an_object(),
            an_array(),
            an_object(),
            two_or_three.map(lambda s: {"anyOf": s}),
            an_array(),
            two_or_three.map(lambda s: {"oneOf": s}),
            st.lists(an_object(), min_size=2, max_size=2).map(lambda s: {"allOf": s}),
        )

    negated = leaves.map(lambda s: {"not": s})
    schemas = st.recursive(st.one_of(*[leaves] * 9, negated), containers, max_leaves=8)
    referenced = schemas.map(
        lambda s: {"$defs": {"t": s}, "type": "array", "items": {"$ref": "#/$defs/t"}}
    )
    return st.one_of(schemas, schemas, schemas, referenced)


def generated_cases(count: int = GENERATED_SCHEMAS, *, is_drawn: bool = False) -> list[Case]:
    """``count`` schemas of :func:`schema_strategy`: the stored ones (the same on every
    machine and hypothesis version), or ``is_drawn`` (derandomized) when storing anew or
    when the store has none."""
    stored = load_store().generated_schemas
    schemas = stored if stored and not is_drawn else draw_examples(schema_strategy(), count)
    return [Case("generated", f"generated-{index}", s) for index, s in enumerate(schemas)]


def custom_formats() -> dict[str, Any]:
    """Formats hypothesis-jsonschema does not know but formline enforces."""
    from hypothesis import strategies as st

    units = st.tuples(*[st.one_of(st.none(), st.integers(0, 99)) for _ in range(6)])

    def duration(parts: tuple[int | None, ...]) -> str:
        date = "".join(f"{v}{u}" for v, u in zip(parts[:3], "YMD", strict=True) if v is not None)
        clock = "".join(f"{v}{u}" for v, u in zip(parts[3:], "HMS", strict=True) if v is not None)
        return "P" + date + ("T" + clock if clock else "") if date or clock else "P0D"

    return {"uuid": st.uuids().map(str), "duration": units.map(duration)}


# --- the oracle: jsonschema, with ECMA-262 regular expressions ------------------------------


def _class_text(ranges: list[tuple[int, int]]) -> str:
    return "".join(
        re.escape(chr(low)) if low == high else f"{re.escape(chr(low))}-{re.escape(chr(high))}"
        for low, high in ranges
    )


@cache
def _shorthands() -> dict[str, str]:
    """ECMA-262 ``\\d \\w \\s`` (``u`` flag) and their negations as class contents."""
    from formline.grammar.utf8 import complement
    from formline.schema.patterns import ECMA_SPACE

    digit, word = [(0x30, 0x39)], [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]
    sets = {"d": digit, "w": word, "s": list(ECMA_SPACE)}
    table = {name: _class_text(ranges) for name, ranges in sets.items()}
    table.update({name.upper(): _class_text(complement(ranges)) for name, ranges in sets.items()})
    return table


@cache
def ecma_regex(pattern: str) -> re.Pattern[str]:
    """``pattern`` (ECMA-262, as JSON Schema specifies) as a Python regex of the same
    language: ASCII ``\\d``/``\\w``, ECMA white space for ``\\s``, ``.`` without the four
    line terminators, ``$`` only at the very end, ``[]``/``[^]``, ``(?<name>``. Python's ``re``
    (what jsonschema uses) differs on each: ``\\d`` matches ``١``, ``$`` matches before a final
    newline. A pattern this does not translate is compiled as it is."""
    table, out, position, in_class = _shorthands(), [], 0, False
    while position < len(pattern):
        character = pattern[position]
        if character == "\\" and position + 1 < len(pattern):
            escaped = pattern[position + 1]
            if escaped in table:
                out.append(table[escaped] if in_class else f"[{table[escaped]}]")
            else:
                out.append(pattern[position : position + 2])
            position += 2
            continue
        if in_class:
            in_class = character != "]"
            out.append(character)
        elif pattern.startswith("[]", position):
            out.append("(?!)")
            position += 1
        elif pattern.startswith("[^]", position):
            out.append("[\\s\\S]")
            position += 2
        elif character == "[":
            in_class = True
            out.append("[^" if pattern.startswith("[^", position) else "[")
            position += 1 if pattern.startswith("[^", position) else 0
        elif character == ".":
            out.append("[^\\n\\r\u2028\u2029]")
        elif character == "$":
            out.append("\\Z")
        elif (
            pattern.startswith("(?<", position) and pattern[position + 3 : position + 4] not in "=!"
        ):
            out.append("(?P<")
            position += 2
        else:
            out.append(character)
        position += 1
    try:
        return re.compile("".join(out))
    except re.error:
        return re.compile(pattern)


def _ecma_search(pattern: str, text: str) -> bool:
    return ecma_regex(pattern).search(text) is not None


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    if validator.is_type(instance, "string") and not _ecma_search(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if validator.is_type(instance, "object"):
        for pattern, subschema in patterns.items():
            for key, value in instance.items():
                if _ecma_search(pattern, key):
                    yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, extra: Any, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "object"):
        return
    declared, patterns = schema.get("properties", {}), schema.get("patternProperties", {})
    extras = [
        key
        for key in instance
        if key not in declared and not any(_ecma_search(p, key) for p in patterns)
    ]
    if validator.is_type(extra, "object"):
        for key in extras:
            yield from validator.descend(instance[key], extra, path=key)
    elif not extra and extras:
        yield ValidationError(f"Additional properties are not allowed ({extras!r} unexpected)")


ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def _plain_email(value: str) -> bool:
    """A dot-atom or quoted local part, then a host name or an [IPv4] / [IPv6:...] literal."""
    import ipaddress

    local, at, domain = value.rpartition("@")
    quoted = re.fullmatch(r'"(?:[ !#-\[\]-~]|\\[ -~])*"', local)
    if not at or not (re.fullmatch(rf"{ATOM}(?:\.{ATOM})*", local) or quoted):
        return False
    if domain.startswith("[") and domain.endswith("]"):
        literal = domain[1:-1]
        try:
            if literal.startswith("IPv6:"):
                ipaddress.IPv6Address(literal[5:])
            else:
                ipaddress.IPv4Address(literal)
        except ValueError:
            return False
        return "%" not in literal
    return all(LABEL.fullmatch(label) for label in domain.split("."))


def _plain_duration(value: str) -> bool:
    return not re.search(r"[.,+\-eE]", value) and (
        "W" not in value or bool(re.fullmatch(r"P\d+W", value))
    )


NARROWER: dict[str, Callable[[str], bool]] = {
    "date-time": lambda value: not value.endswith("\n"),
    "time": lambda value: not value.endswith("\n"),
    "uri": lambda value: not value.endswith("\n"),
    "hostname": lambda value: value.isascii() and not value.endswith("\n"),
    "email": _plain_email,
    "uuid": lambda value: bool(
        re.fullmatch(r"[0-9A-Fa-f]{8}(?:-[0-9A-Fa-f]{4}){3}-[0-9A-Fa-f]{12}", value)
    ),
    "duration": _plain_duration,
}
"""Format -> the extra condition of formline's documented narrowing (``FORMAT_NARROWER`` in
schema/formats.py: a final newline, fqdn's Unicode, any string with an '@', uuid.UUID's other
spellings, isoduration's extensions), written independently of formline's regexes."""


@cache
def _format_checker(draft: Any) -> Any:
    """The draft's format checker, narrowed as formline documents it (:data:`NARROWER`)."""
    from jsonschema import FormatChecker

    base = draft.FORMAT_CHECKER
    checker = FormatChecker(formats=())
    checker.checkers = dict(base.checkers)
    for name, narrower in NARROWER.items():
        if name in base.checkers:

            def conforms(value: Any, name: str = name, narrower: Any = narrower) -> bool:
                if not base.conforms(value, name):
                    return False
                return not isinstance(value, str) or narrower(value)

            checker.checkers[name] = (conforms, ())
    return checker


def oracle(schema: Any) -> Any:
    """The validator of :meth:`CompiledSchema.check` (the schema's draft and its format
    checker) with ECMA-262 semantics for ``pattern``, ``patternProperties`` and
    ``additionalProperties`` (whose extra keys depend on the patterns), and the format
    narrowings formline documents (:data:`NARROWER`)."""
    from jsonschema.validators import Draft202012Validator, validator_for

    draft = validator_for(schema, default=Draft202012Validator)
    return _ecma_draft(draft)(schema, format_checker=_format_checker(draft))


@cache
def _ecma_draft(draft: Any) -> Any:
    from jsonschema.validators import extend

    keywords = {"pattern": _pattern, "patternProperties": _pattern_properties}
    if "additionalProperties" in draft.VALIDATORS:
        keywords["additionalProperties"] = _additional_properties
    return extend(draft, keywords)


# --- which keywords an invalid instance violates, and what the report says of them ----------


def _escape(part: Any) -> str:
    return str(part).replace("~", "~0").replace("/", "~1")


def schema_pointers(schema: Any) -> dict[int, str]:
    """id(subschema) -> its JSON pointer, for every object and array in ``schema``."""
    pointers: dict[int, str] = {}
    pending = [(schema, "")]
    while pending:
        node, pointer = pending.pop()
        if isinstance(node, dict):
            pointers.setdefault(id(node), pointer)
            pending.extend((v, f"{pointer}/{_escape(k)}") for k, v in node.items())
        elif isinstance(node, list):
            pointers.setdefault(id(node), pointer)
            pending.extend((v, f"{pointer}/{i}") for i, v in enumerate(node))
    return pointers


ENFORCED, AFTER, UNCLASSIFIED = "enforced", "checked after", "unclassified"


class Classifier:
    """Says, for an invalid instance, whether the report claims the grammar refuses it."""

    def __init__(self, schema: Any, report: Any, validator: Any):
        self.validator = validator
        self.root = schema
        self.pointers = schema_pointers(schema)
        self.enforced = {(use.keyword, use.pointer) for use in report.enforced}
        self.after = {
            (use.keyword, use.pointer)
            for uses in (report.checked_after, report.unsupported, report.ignored)
            for use in uses
        }

    def classify(self, instance: Any) -> tuple[str, list[str]]:
        """(ENFORCED if some violated keyword is enforced, else AFTER if all are checked
        after, else UNCLASSIFIED; the violated ``keyword at pointer`` list)."""
        statuses = [(self.status(e), self.where(e)) for e in self.validator.iter_errors(instance)]
        where = [w for _, w in statuses]
        if any(status == ENFORCED for status, _ in statuses):
            return ENFORCED, [w for s, w in statuses if s == ENFORCED]
        if statuses and all(status == AFTER for status, _ in statuses):
            return AFTER, where
        return UNCLASSIFIED, where

    def where(self, error: Any) -> str:
        pointer = self.pointers.get(id(error.schema), "?")
        return f"{error.validator} at {pointer or '/'}"

    def resolve(self, reference: Any) -> tuple[Any, str] | None:
        """A local ``$ref`` (``#`` or ``#/json/pointer``): (target, its pointer)."""
        if not isinstance(reference, str) or not reference.startswith("#"):
            return None
        node, fragment = self.root, unquote(reference[1:])
        for part in fragment.split("/")[1:] if fragment else []:
            key = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and key in node:
                node = node[key]
            elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
                node = node[int(key)]
            else:
                return None
        return node, fragment

    def applicators(self, error: Any) -> list[tuple[str, str]]:
        """(keyword, pointer) of every keyword on the error's schema path above its own:
        jsonschema leaves ``$ref`` out of the path, so a key missing from a schema with a
        local ``$ref`` continues in the ``$ref``'s target."""
        node, pointer, found = self.root, "", []
        parts = list(error.absolute_schema_path)[:-1]
        position = 0
        while position < len(parts):
            part = parts[position]
            if isinstance(node, dict) and part not in node:
                target = self.resolve(node.get("$ref"))
                if target is None or target[0] is node:
                    break
                node, pointer = target
                continue
            if isinstance(node, dict):
                found.append((str(part), pointer))
                node = node[part]
            elif isinstance(node, list) and isinstance(part, int) and part < len(node):
                node = node[part]
            else:
                break
            pointer += "/" + _escape(part)
            position += 1
        return found

    def lookup(self, keyword: str, pointer: str) -> str:
        """What the report says of ``keyword`` at ``pointer``: there, else where the compiler
        put it: ``allOf`` merged into its parent (``/allOf/0/x`` is reported at ``/x``), or
        a schema beside ``anyOf``/``oneOf`` distributed into every branch (``/properties/a``
        is reported at ``/anyOf/0/properties/a``, ``/anyOf/1/properties/a``, ...)."""
        merged = re.sub(r"/allOf/\d+", "", pointer)
        for use in dict.fromkeys([(keyword, pointer), (keyword, merged)]):
            if use in self.after:
                return AFTER
            if use in self.enforced:
                return ENFORCED
        parts = pointer.split("/")
        for cut in range(len(parts), 0, -1):
            prefix, rest = "/".join(parts[:cut]), "/".join(["", *parts[cut:]]).rstrip("/")
            target = self.resolve("#" + prefix)
            node = target[0] if target else None
            for branches in ("anyOf", "oneOf"):
                if not isinstance(node, dict) or not isinstance(node.get(branches), list):
                    continue
                count = len(node[branches])
                uses = [(keyword, f"{prefix}/{branches}/{i}{rest}") for i in range(count)]
                if any(use in self.after for use in uses):
                    return AFTER
                if count and all(use in self.enforced for use in uses):
                    return ENFORCED
        return UNCLASSIFIED

    def status(self, error: Any) -> str:
        pointer = self.pointers.get(id(error.schema))
        if pointer is None:  # a remote or otherwise unresolved subschema
            return UNCLASSIFIED
        if any(self.lookup(*use) == AFTER for use in self.applicators(error)):
            # A keyword above is checked after, so what it applies is not enforced either:
            # e.g. properties or patternProperties (a key from propertyNames, or one taking the
            # additionalProperties branch, may repeat a declared name with any value).
            return AFTER
        found = self.lookup(str(error.validator), pointer)
        if found != ENFORCED:
            return found
        if error.validator in ("anyOf", "oneOf") and isinstance(error.validator_value, list):
            by_branch: dict[int, list[str]] = {}
            for cause in error.context or []:
                branch = int(cause.relative_schema_path[0])
                by_branch.setdefault(branch, []).append(self.status(cause))
            if len(by_branch) < len(error.validator_value):
                # Valid under some branch: only oneOf's "more than one" can fail this way,
                # and the report claims oneOf is enforced.
                return ENFORCED
            branch_statuses = [
                ENFORCED
                if ENFORCED in statuses
                else AFTER
                if all(s == AFTER for s in statuses)
                else UNCLASSIFIED
                for statuses in by_branch.values()
            ]
            if all(s == ENFORCED for s in branch_statuses):
                return ENFORCED
            return AFTER if AFTER in branch_statuses else UNCLASSIFIED
        return ENFORCED


# --- mutations ----------------------------------------------------------------------------


def _paths(value: Any, limit: int = 400) -> list[tuple[Any, ...]]:
    """The paths of ``value``'s nodes (root first), at most ``limit``."""
    found: list[tuple[Any, ...]] = []
    pending: list[tuple[Any, tuple[Any, ...]]] = [(value, ())]
    while pending and len(found) < limit:
        node, path = pending.pop(0)
        found.append(path)
        if isinstance(node, dict):
            pending.extend((v, (*path, k)) for k, v in node.items())
        elif isinstance(node, list):
            pending.extend((v, (*path, i)) for i, v in enumerate(node))
    return found


def _get(value: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        value = value[part]
    return value


def _replace(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {k: (_replace(v, rest, new) if k == head else v) for k, v in value.items()}
    return [(_replace(v, rest, new) if i == head else v) for i, v in enumerate(value)]


def schema_constants(schema: Any) -> tuple[list[float | int], list[int], list[str]]:
    """The numeric bounds, the length bounds and the property names anywhere in ``schema``."""
    numbers: set[float | int] = set()
    lengths: set[int] = set()
    names: set[str] = set()
    numeric = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
    counted = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
    pending = [schema]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                is_number = isinstance(value, int | float) and not isinstance(value, bool)
                if key in numeric and is_number and math.isfinite(value):
                    numbers.add(value)
                elif key in counted and isinstance(value, int) and not isinstance(value, bool):
                    lengths.add(value)
                elif key == "properties" and isinstance(value, dict):
                    names.update(value)
                pending.append(value)
        elif isinstance(node, list):
            pending.extend(node)
    return sorted(numbers)[:24], sorted(lengths)[:12], sorted(names)[:40]


OTHER_TYPES: list[Any] = [None, True, 0, -7, 1.5, "", "zz", [], {}, [1], {"a": 1}]


def mutation_candidates(
    instance: Any, schema: Any, rng: random.Random
) -> Iterator[tuple[str, Any]]:
    """Endless (description, mutated instance) candidates, drawn at random: wrong types,
    values past bounds, strings changed at either end or cut to a bound, arrays and objects
    shortened or grown, required keys dropped, extra keys added."""
    paths = _paths(instance)
    numbers, lengths, names = schema_constants(schema)
    while True:
        path = rng.choice(paths)
        old = _get(instance, path)
        where = "/" + "/".join(_escape(part) for part in path)
        options: list[tuple[str, Any]] = [
            ("type", rng.choice([v for v in OTHER_TYPES if type(v) is not type(old)]))
        ]
        if isinstance(old, bool) or old is None:
            options.append(("flip", (not old) if isinstance(old, bool) else False))
        elif isinstance(old, int | float):
            delta = rng.choice([1, -1, 0.5, -0.5, 1000, -1000, 10**15])
            options.append((f"{old}+{delta}", old + delta))
            if isinstance(old, float) and old == int(old) and abs(old) < 1e15:
                options.append(("int", int(old)))
            for bound in rng.sample(numbers, min(3, len(numbers))):
                near = [bound, bound - 1, bound + 1, bound - 0.5, bound + 0.5, bound + 0.01]
                options.append(("bound", rng.choice(near)))
        elif isinstance(old, str):
            suffix = rng.choice(["a", "#", "0", " ", "é", "\n", "Z", "-", "x" * 40])
            options += [
                ("append", old + suffix),
                ("prepend", suffix + old),
                ("drop last", old[:-1]),
                ("drop first", old[1:]),
                ("upper", old.upper() + ("A" if old.upper() == old else "")),
            ]
            for size in lengths:
                for target in (size - 1, size + 1):
                    if target >= 0:
                        padded = (old + (old[-1:] or "a") * (target + 1))[:target]
                        options.append((f"length {target}", padded))
        elif isinstance(old, list):
            options += [("drop last item", old[:-1]), ("empty", [])]
            if old:
                options += [("repeat last item", [*old, old[-1]]), ("null item", [*old, None])]
                options.append(("first item", [old[0], *old]))
            for size in lengths:
                if size + 1 <= 64 and old:
                    options.append((f"{size + 1} items", (old * (size + 1))[: size + 1]))
        elif isinstance(old, dict):
            for key in rng.sample(sorted(old), min(3, len(old))):
                options.append((f"drop {key}", {k: v for k, v in old.items() if k != key}))
            extras = [n for n in names if n not in old] + ["zz_extra"]
            extra = rng.choice(extras)
            options.append((f"add {extra}", {**old, extra: rng.choice([0, "x", None, {}])}))
        # A wrong type is nearly always invalid and easy to refuse: one draw in four.
        name, new = (
            options[0] if len(options) == 1 or rng.random() < 0.25 else rng.choice(options[1:])
        )
        yield f"{name} at {where}", _replace(instance, path, new)


# --- the walk -----------------------------------------------------------------------------


@dataclass
class Walk:
    """The outcome of walking one text: accepted to termination, or where it was refused."""

    accepted: bool
    position: int = -1  # index of the refused token; len(tokens) when the end was refused
    byte_offset: int = -1
    detail: str = ""


Piece = int | bytes  # a token id, or raw bytes no token of the vocabulary holds


class Tokenizer:
    """The real tokenizer's canonical encoding of the text. A character whose UTF-8 bytes
    some byte of has no token (SmolLM2 has no token for 21 byte values, among them 0xF1 and
    0xF2, the lead bytes of U+40000..U+BFFFF) is walked as raw bytes, and the text between
    such characters is encoded by the tokenizer piece by piece; where the tokens do not give
    back the text's bytes, greedy longest match is used."""

    def __init__(self, vocabulary: Any, tokenizer: Any):
        self.vocabulary = vocabulary
        self.tokenizer = tokenizer
        self.lookup = {
            data: token_id
            for token_id, data in enumerate(vocabulary.token_bytes)
            if data
            and token_id not in vocabulary.special_ids
            and token_id not in vocabulary.eos_ids
        }
        self.longest = max(len(data) for data in self.lookup)
        missing = {value for value in range(256) if bytes((value,)) not in self.lookup}
        self.untokenizable = re.compile(_untokenizable_class(missing))
        self.greedy = 0
        self.raw = 0

    def encode(self, text: str) -> list[Piece]:
        pieces: list[Piece] = []
        position = 0
        for match in self.untokenizable.finditer(text):
            pieces += self.encode_piece(text[position : match.start()])
            pieces.append(match.group().encode("utf-8"))
            position = match.end()
        if position:
            self.raw += 1
        return pieces + self.encode_piece(text[position:])

    def encode_piece(self, text: str) -> list[Piece]:
        if not text:
            return []
        data = text.encode("utf-8")
        ids: list[int] = list(self.tokenizer.encode(text, add_special_tokens=False))
        # A text that spells a special token ("<|endoftext|>" as a key: hypothesis drew one)
        # is encoded as that token by the tokenizer, and a matcher reads it as the stop.
        plain = not any(
            i in self.vocabulary.special_ids or i in self.vocabulary.eos_ids for i in ids
        )
        if plain and b"".join(self.vocabulary.token_bytes[i] for i in ids) == data:
            return list(ids)
        self.greedy += 1
        pieces: list[Piece] = []
        position = 0
        while position < len(data):
            for size in range(min(self.longest, len(data) - position), 0, -1):
                token_id = self.lookup.get(data[position : position + size])
                if token_id is not None:
                    pieces.append(token_id)
                    position += size
                    break
            else:
                pieces.append(data[position : position + 1])
                position += 1
        return pieces


def _untokenizable_class(missing: set[int]) -> str:
    """A regex class of the characters one of whose UTF-8 bytes is in ``missing``: ASCII ones
    by value, others by the lead byte of their encoding (continuation bytes 0x80..0xBF are
    assumed present)."""
    ranges = [(code, code) for code in range(128) if code in missing]
    if not ranges and not any(value >= 0xC2 for value in missing):
        return "(?!)"
    for value in sorted(missing):
        if 0xC2 <= value <= 0xDF:
            low = (value - 0xC0) << 6
            ranges.append((low, low + 0x3F))
        elif 0xE0 <= value <= 0xEF:
            low = (value - 0xE0) << 12
            ranges.append((max(low, 0x800), low + 0xFFF))
        elif 0xF0 <= value <= 0xF4:
            low = (value - 0xF0) << 18
            ranges.append((max(low, 0x10000), low + 0x3FFFF))
    return "[" + _class_text(ranges) + "]"


def walk(compiled: Any, pieces: list[Piece], token_bytes: list[bytes], eos: int) -> Walk:
    """Feed ``pieces`` (tokens, or raw bytes as a string) then EOS to a fresh matcher."""
    matcher = compiled.matcher(max_rollback_tokens=0)
    offset = 0
    for position, piece in enumerate(pieces):
        data = piece if isinstance(piece, bytes) else token_bytes[piece]
        ok = (
            matcher.accept_string(piece)
            if isinstance(piece, bytes)
            else matcher.accept_token(piece)
        )
        if not ok:
            shown = data.decode("utf-8", "replace")
            return Walk(False, position, offset, f"token {position} {shown!r} refused")
        offset += len(data)
    if not matcher.can_end():
        return Walk(False, len(pieces), offset, "the end (EOS) refused: text incomplete")
    if not matcher.accept_token(eos) or not matcher.is_terminated():
        return Walk(False, len(pieces), offset, "EOS refused or matcher not terminated")
    return Walk(True)


# --- the tally ----------------------------------------------------------------------------


@dataclass
class Counterexample:
    kind: str  # VALID_REFUSED or INVALID_ACCEPTED
    source: str
    label: str
    schema: Any
    instance: Any
    text: str
    walk: Walk
    note: str = ""
    known: str = ""  # the name of the KNOWN_BUGS entry it matches

    def __str__(self) -> str:
        schema = json.dumps(self.schema, ensure_ascii=False)
        if len(schema) > 400:
            schema = schema[:400] + "..."
        if self.walk.accepted:
            where = "accepted to the end (EOS accepted)"
        else:
            before = self.text.encode("utf-8")[: self.walk.byte_offset].decode("utf-8", "replace")
            where = (
                f"refused: {self.walk.detail}, at byte {self.walk.byte_offset},"
                f" after ...{before[-40:]!r}"
            )
        text = self.text if len(self.text) <= 400 else self.text[:400] + "..."
        return (
            f"[{self.kind}] {self.source}/{self.label} ({self.note})"
            f"\n    schema:   {schema}\n    instance: {text}\n    {where}"
        )


VALID_REFUSED, INVALID_ACCEPTED = "valid refused", "invalid accepted where enforced"


@dataclass
class Tally:
    """Every count of a run, its counterexamples and the time per phase."""

    counts: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)  # schema skip reason -> count
    failures: list[Counterexample] = field(default_factory=list)
    known: list[Counterexample] = field(default_factory=list)
    unclassified: Counter[str] = field(default_factory=Counter)
    seconds: Counter[str] = field(default_factory=Counter)

    def skip(self, case: Case, reason: str) -> None:
        self.counts[f"schemas skipped ({case.source})"] += 1
        self.skipped[reason] += 1

    def summary(self) -> str:
        """The figures of the run, one paragraph per subject."""
        c, t = self.counts, self.seconds
        lines = [
            f"soundness: {c['schemas tried']} schemas tried, {c['schemas compiled']} compiled,"
            f" {c['schemas not compiled']} not compiled, {c['schemas without instances']}"
            " compiled but without any valid instance to walk;"
            f" {sum(t.values()):.0f} s (compile {t['compile']:.0f}, generate {t['generate']:.0f},"
            f" validate and mutate {t['validate']:.0f}, tokenize and walk {t['walk']:.0f})",
        ]
        for source in ("extraction-dev", "maskbench", "generated"):
            lines.append(
                f"  {source}: {c[f'schemas tried ({source})']} tried,"
                f" {c[f'schemas compiled ({source})']} compiled;"
                f" {c[f'valid tried ({source})']} valid and"
                f" {c[f'invalid tried ({source})']} invalid instances walked"
            )
        lines.append("  schemas skipped or cut short, by reason:")
        lines += [f"    {n:4d}  {reason}" for reason, n in sorted(self.skipped.items())]
        lines += [
            f"  valid instances: {c['valid tried']} walked ({c['valid generated']} generated by"
            f" hypothesis-jsonschema, {c['valid shipped']} shipped with the data,"
            f" {c['valid mutated']} mutations that stayed valid): {c['valid refused']} refused"
            f" ({c['valid refused, known bug']} by known bugs)",
            f"  invalid instances: {c['invalid tried']} walked ({c['invalid mutated']} mutations,"
            f" {c['invalid shipped']} shipped, {c['invalid generated']} generated values the"
            f" oracle refuses); {c['invalid enforced']} violate an enforced keyword:"
            f" {c['invalid refused']} refused, {c['invalid accepted where enforced']} accepted"
            f" ({c['invalid accepted, known bug']} by known bugs);"
            f" {c['invalid checked after']} violate only checked-after keywords (not walked),"
            f" {c['invalid unclassified']} unclassified (not walked)",
            f"  oracle: {c['float rounding']} disagreements that only jsonschema's float"
            " comparisons explain (exact decimals agree with formline; not counted as failures)",
            f"  mutation candidates that stayed valid: {c['mutation still valid']};"
            f" texts over {MAX_TEXT_BYTES} bytes not walked: {c['text too long']};"
            f" texts with characters no token holds (those walked as raw bytes): {c['raw bytes']};"
            f" greedy tokenizations (the tokenizer did not give the bytes back): {c['greedy']}",
        ]
        if self.unclassified:
            top = ", ".join(f"{k} ({n})" for k, n in self.unclassified.most_common(8))
            lines.append(f"  unclassified violations (keyword not in the report there): {top}")
        return "\n".join(lines)

    def failure_text(self, limit: int = 25) -> str:
        """The counterexamples, readable: source/file, schema, instance, where refused."""
        shown = "\n".join(str(failure) for failure in self.failures[:limit])
        more = len(self.failures) - limit
        return shown + (f"\n... and {more} more" if more > 0 else "")


# --- known bugs ---------------------------------------------------------------------------


# Where a format's name is data, not a keyword: left as it is when formats are removed.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})


def _format_outside_its_draft(failure: Counterexample, checker: Any) -> bool:
    """By design, not a bug: a format the schema's draft does not define (``date`` in draft
    4) is enforced by the grammar as 2020-12 defines it (schemas in the wild mean it), and
    the report says so, although that draft's format checker, and so the after-check,
    ignores it. Matches only a refusal those formats cause: the instance is walked again
    under the schema without them (one more compile), and must be accepted there; a
    refusal that stays is a bug, and fails."""
    from jsonschema.validators import Draft202012Validator, validator_for

    if failure.kind != VALID_REFUSED:
        return False
    from formline.schema import SchemaError
    from formline.schema.formats import FORMAT_PATTERNS

    draft = validator_for(failure.schema, default=Draft202012Validator)
    defined = draft.FORMAT_CHECKER.checkers
    foreign = {name for name in FORMAT_PATTERNS if name not in defined}
    stripped = _without_formats(failure.schema, foreign)
    if stripped == failure.schema:
        return False
    try:
        compiled = checker.compile(stripped)
    except SchemaError:
        return False
    prepared = checker.text_and_pieces(compiled, failure.instance)
    return (
        prepared is not None
        and walk(compiled, prepared[1], checker.token_bytes, checker.eos).accepted
    )


def _without_formats(schema: Any, names: set[str]) -> Any:
    """A copy of ``schema`` without the ``format`` keywords naming one of ``names``."""
    if isinstance(schema, list):
        return [_without_formats(item, names) for item in schema]
    if not isinstance(schema, dict):
        return schema
    return {
        key: value if key in _DATA_KEYWORDS else _without_formats(value, names)
        for key, value in schema.items()
        if not (key == "format" and isinstance(value, str) and value in names)
    }


KnownBug = tuple[str, Callable[[Counterexample, Any], bool]]
KNOWN_BUGS: list[KnownBug] = [
    ("format: a name the schema's draft does not define", _format_outside_its_draft),
]
"""A counterexample one of these matches is counted, not failed: the one left is by design
(see its matcher). The three bugs this test found first (integral floats of 1e16 or more in
enums and as integers, numbers inside const arrays and objects) are fixed, and their minimal
repros are regression tests in test_schema_soundness.py."""


# --- the exact oracle for numbers ---------------------------------------------------------


def exact(value: Any) -> Any:
    """``value`` with every float as the Decimal of its JSON text (``repr``), the value
    formline compares (jsonschema compares Python floats: 36893488147419103231 passes
    ``maximum: 3.6893488147419103e+19`` because that float is 2**65)."""
    return json.loads(json.dumps(value), parse_float=Decimal)


@cache
def _decimal_type_checker(draft: type) -> Any:
    def is_integer(checker: Any, instance: Any) -> bool:
        if isinstance(instance, Decimal):
            return instance.is_finite() and instance == instance.to_integral_value()
        return bool(draft.TYPE_CHECKER.is_type(instance, "integer"))

    def is_number(checker: Any, instance: Any) -> bool:
        return isinstance(instance, Decimal) or bool(draft.TYPE_CHECKER.is_type(instance, "number"))

    return draft.TYPE_CHECKER.redefine_many({"integer": is_integer, "number": is_number})


def exact_is_valid(schema: Any, instance: Any) -> bool:
    """The oracle's verdict with numbers as exact decimals (schema and instance)."""
    from jsonschema.validators import Draft202012Validator, extend, validator_for

    draft = validator_for(schema, default=Draft202012Validator)
    cls = extend(_ecma_draft(draft), type_checker=_decimal_type_checker(draft))
    validator = cls(exact(schema), format_checker=_format_checker(draft))
    return bool(validator.is_valid(exact(instance)))


# --- the run ------------------------------------------------------------------------------


class Checker:
    """Runs cases against one vocabulary and its Hugging Face tokenizer, into a Tally."""

    def __init__(self, vocabulary: Any, tokenizer: Any, tally: Tally | None = None):
        self.vocabulary = vocabulary
        self.tokenizer = Tokenizer(vocabulary, tokenizer)
        self.token_bytes = vocabulary.token_bytes
        self.eos = min(vocabulary.eos_ids)
        self.tally = tally if tally is not None else Tally()

    def run(self, cases: list[Case]) -> Tally:
        for case in cases:
            self.run_case(case)
        self.tally.counts["greedy"] = self.tokenizer.greedy
        self.tally.counts["raw bytes"] = self.tokenizer.raw
        return self.tally

    def timed(self, phase: str, function: Callable[..., Any], *arguments: Any) -> Any:
        start = time.monotonic()
        try:
            return function(*arguments)
        finally:
            self.tally.seconds[phase] += time.monotonic() - start

    def compile(self, schema: Any) -> Any:
        from formline.schema import compile_schema

        return compile_schema(schema, self.vocabulary, disk_cache=False)

    def run_case(self, case: Case) -> None:
        from formline.schema import SchemaError

        counts = self.tally.counts
        counts["schemas tried"] += 1
        counts[f"schemas tried ({case.source})"] += 1
        try:
            compiled = self.timed("compile", self.compile, case.schema)
        except SchemaError as error:
            counts["schemas not compiled"] += 1
            self.tally.skip(case, f"not compiled: {_first_words(error)}")
            return
        counts["schemas compiled"] += 1
        counts[f"schemas compiled ({case.source})"] += 1
        generated, reason = self.timed("generate", self.examples, case)
        valid, invalid = self.timed("validate", self.instances, case, generated)
        if not valid:
            counts["schemas without instances"] += 1
            self.tally.skip(case, f"no valid instance: hypothesis-jsonschema: {reason}")
        elif reason is not None:
            self.tally.skipped[f"cut short (other instances walked): {reason}"] += 1
        classifier = Classifier(case.schema, compiled.report, oracle(case.schema))
        for instance, origin in valid:
            self.timed("walk", self.check_valid, case, compiled, instance, origin)
        for instance, origin in invalid:
            self.timed("walk", self.check_invalid, case, compiled, classifier, instance, origin)

    def examples(self, case: Case) -> tuple[list[Any], str | None]:
        """The stored examples of ``case`` (and why drawing stopped early), or, for a schema
        the store lacks, those drawn live within ``GENERATION_BUDGET_S`` (counted)."""
        stored = load_store().lookup(case.schema, EXAMPLES[case.source])
        if stored is not None:
            return stored.examples, stored.reason
        self.tally.counts["schemas drawn live"] += 1
        budget = GENERATION_BUDGET_S[case.source]
        return generate_with_budget(case.schema, EXAMPLES[case.source], budget)

    def instances(
        self, case: Case, generated: list[Any]
    ) -> tuple[list[tuple[Any, str]], list[tuple[Any, str]]]:
        """(valid, invalid) instances with their origin: the generated and shipped ones as
        the oracle judges them, then mutations of each valid one (the oracle says which
        mutations are invalid; up to one that stays valid is walked as valid too)."""
        validator = oracle(case.schema)
        valid: list[tuple[Any, str]] = []
        invalid: list[tuple[Any, str]] = []
        seen: set[str] = set()

        def add(instance: Any, origin: str, is_valid: bool | None = None) -> None:
            key = json.dumps(instance, sort_keys=True)
            if key not in seen:
                seen.add(key)
                verdict = validator.is_valid(instance) if is_valid is None else is_valid
                (valid if verdict else invalid).append((instance, origin))

        for instance in generated:
            add(instance, "generated")
        for instance, _claimed_valid in case.shipped:
            add(instance, "shipped")
        for index, (instance, _origin) in enumerate(list(valid)):
            rng = random.Random(zlib.crc32(f"{case.label}#{index}".encode()))
            candidates = mutation_candidates(instance, case.schema, rng)
            found, kept_valid = 0, False
            for _ in range(MUTATION_ATTEMPTS):
                note, mutated = next(candidates)
                if validator.is_valid(mutated):
                    self.tally.counts["mutation still valid"] += 1
                    if not kept_valid:
                        add(mutated, f"mutated: {note}", True)
                        kept_valid = True
                    continue
                add(mutated, f"mutated: {note}", False)
                found += 1
                if found == MUTATIONS_PER_INSTANCE:
                    break
        return valid, invalid

    def text_and_pieces(self, compiled: Any, instance: Any) -> tuple[str, list[Piece]] | None:
        text = compiled.serialize(instance)
        if len(text.encode("utf-8", "surrogatepass")) > MAX_TEXT_BYTES:
            self.tally.counts["text too long"] += 1
            return None
        return text, self.tokenizer.encode(text)

    def check_valid(self, case: Case, compiled: Any, instance: Any, origin: str) -> None:
        counts = self.tally.counts
        prepared = self.text_and_pieces(compiled, instance)
        if prepared is None:
            return
        text, pieces = prepared
        kind = origin.split(":")[0]
        counts["valid tried"] += 1
        counts[f"valid {kind}"] += 1
        counts[f"valid tried ({case.source})"] += 1
        result = walk(compiled, pieces, self.token_bytes, self.eos)
        if result.accepted:
            return
        if not exact_is_valid(case.schema, instance):
            counts["float rounding"] += 1
            return
        counts["valid refused"] += 1
        failure = Counterexample(
            VALID_REFUSED, case.source, case.label, case.schema, instance, text, result, origin
        )
        self.record(failure, "valid refused, known bug")

    def check_invalid(
        self, case: Case, compiled: Any, classifier: Classifier, instance: Any, origin: str
    ) -> None:
        counts = self.tally.counts
        prepared = self.text_and_pieces(compiled, instance)
        if prepared is None:
            return
        text, pieces = prepared
        counts["invalid tried"] += 1
        counts[f"invalid {origin.split(':')[0]}"] += 1
        counts[f"invalid tried ({case.source})"] += 1
        status, violated = classifier.classify(instance)
        if status == AFTER:
            counts["invalid checked after"] += 1
            return
        if status == UNCLASSIFIED:
            counts["invalid unclassified"] += 1
            self.tally.unclassified.update(violated)
            return
        counts["invalid enforced"] += 1
        result = walk(compiled, pieces, self.token_bytes, self.eos)
        if not result.accepted:
            counts["invalid refused"] += 1
            return
        if exact_is_valid(case.schema, instance):
            counts["float rounding"] += 1
            return
        counts["invalid accepted where enforced"] += 1
        note = f"{origin}; violates {', '.join(violated)}"
        failure = Counterexample(
            INVALID_ACCEPTED, case.source, case.label, case.schema, instance, text, result, note
        )
        self.record(failure, "invalid accepted, known bug")

    def record(self, failure: Counterexample, known_count: str) -> None:
        for name, matches in KNOWN_BUGS:
            if matches(failure, self):
                failure.known = name
                self.tally.counts[known_count] += 1
                self.tally.known.append(failure)
                return
        self.tally.failures.append(failure)


def _first_words(error: BaseException, size: int = 90) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    text = re.sub(r"\d+", "N", text)  # one reason for messages that differ only by numbers
    return text[:size]


def all_cases() -> list[Case]:
    """The extraction-dev schemas, the MaskBench sample and the generated schemas."""
    return extraction_dev_cases() + maskbench_cases() + generated_cases()


def run_all(vocabulary: Any, tokenizer: Any) -> Tally:
    """The whole property check; ``run_all(...).summary()`` is the figures."""
    return Checker(vocabulary, tokenizer).run(all_cases())


def default_run() -> Tally:
    """:func:`run_all` on SmolLM2's vocabulary and tokenizer (the cached fixtures)."""
    from transformers import AutoTokenizer

    from formline.vocab import Vocabulary
    from formline.vocab.fixtures import fixture_path

    path = fixture_path("smollm2")
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return run_all(Vocabulary.from_gguf(path), tokenizer)


def store_examples() -> ExampleStore:
    """Draw every case's examples anew within ``STORE_BUDGET_S`` each and write the store
    (77 s on 2 cores). Returns the store written."""
    from importlib.metadata import version

    cases = extraction_dev_cases() + maskbench_cases() + generated_cases(is_drawn=True)
    store = ExampleStore(
        generated_schemas=[case.schema for case in cases if case.source == "generated"],
        generator={name: version(name) for name in ("hypothesis", "hypothesis-jsonschema")},
    )
    for index, case in enumerate(cases):
        count = EXAMPLES[case.source]
        examples, reason = generate_with_budget(case.schema, count, STORE_BUDGET_S)
        store.entries[schema_key(case.schema, count)] = Stored(examples, reason)
        print(f"{index + 1}/{len(cases)} {case.source}/{case.label}: {len(examples)} ({reason})")
    write_store(store)
    load_store.cache_clear()
    return store


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    if "--store-examples" in sys.argv:
        store_examples()
        sys.exit(0)
    result = default_run()
    print(result.summary())
    if result.failures:
        print(result.failure_text(limit=100))
