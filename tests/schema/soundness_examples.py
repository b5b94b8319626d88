"""The stored valid instances of the soundness run: what hypothesis-jsonschema drew, once.

Drawing is derandomized but stopped by a wall-clock budget per schema (a single draw can
take minutes), so a live run's counts depended on the machine's speed: the same commit drew
949 valid instances here and 772 on CI (1.4x slower at generation), under the 800 the
coverage test asks for. The run now reads the instances from ``tests/data/soundness/
examples.json``, drawn once with a budget far above any schema's need, and its counts are
the same on every machine; it also saves the run's 110 s of drawing.

The store holds the generated schemas too (what :func:`soundness.schema_strategy` drew),
because hypothesis's derandomized draws may change between its versions. Regenerate the
store after changing a schema source, ``EXAMPLES`` or the strategy::

    PYTHONPATH=src python3 tests/schema/soundness.py --store-examples

A schema missing from the store is drawn live (counted as ``schemas drawn live``, which the
coverage test requires to be zero, naming the command above).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

STORE = Path(__file__).resolve().parents[1] / "data" / "soundness" / "examples.json"
STORE_BUDGET_S = 8.0  # per schema: 215 of the 216 finish well within; one draws 1 example in 8 s


def schema_key(schema: Any, count: int) -> str:
    """The store's key of ``count`` examples of ``schema``: a hash of its canonical JSON."""
    text = json.dumps({"schema": schema, "count": count}, sort_keys=True, ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()[:20]


@dataclass
class Stored:
    """The examples of one schema and why drawing stopped early (``None``: it drew all)."""

    examples: list[Any]
    reason: str | None


@dataclass
class ExampleStore:
    """The generated schemas and, by :func:`schema_key`, the examples of every schema."""

    generated_schemas: list[Any] = field(default_factory=list)
    entries: dict[str, Stored] = field(default_factory=dict)
    generator: dict[str, str] = field(default_factory=dict)

    def lookup(self, schema: Any, count: int) -> Stored | None:
        return self.entries.get(schema_key(schema, count))


@cache
def load_store() -> ExampleStore:
    """The store as committed; an empty one when the file is missing (every schema is then
    drawn live, and the coverage test says so). Raises ``ValueError`` on a malformed file."""
    if not STORE.exists():
        return ExampleStore()
    document = json.loads(STORE.read_text(encoding="utf-8"))
    entries = {
        key: Stored(list(value["examples"]), value["reason"])
        for key, value in document["examples"].items()
    }
    return ExampleStore(list(document["generated_schemas"]), entries, dict(document["generator"]))


def write_store(store: ExampleStore) -> None:
    """Write ``store`` as JSON with one generated schema, and one schema's examples, a line
    (a new draw shows in a diff as the lines of the schemas it changed)."""
    head = {
        "about": "valid instances drawn by hypothesis-jsonschema for"
        " tests/schema/test_schema_soundness.py; see tests/schema/soundness_examples.py",
        "generator": store.generator,
        "budget_s": STORE_BUDGET_S,
    }
    schemas = ",\n".join(
        json.dumps(schema, ensure_ascii=True) for schema in store.generated_schemas
    )
    examples = ",\n".join(
        f"{json.dumps(key)}: "
        + json.dumps({"examples": entry.examples, "reason": entry.reason}, ensure_ascii=True)
        for key, entry in sorted(store.entries.items())
    )
    text = json.dumps(head, ensure_ascii=True)[:-1]
    text += f',\n"generated_schemas": [\n{schemas}\n],\n"examples": {{\n{examples}\n}}}}\n'
    STORE.parent.mkdir(parents=True, exist_ok=True)
    STORE.write_text(text, encoding="utf-8")
