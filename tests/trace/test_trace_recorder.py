"""The trace recorder's pure parts and the page writer (no model needed)."""

from __future__ import annotations

import json
import re

from tqdm import tqdm

from formline.schema import compile_schema
from formline.trace import classify, record_trace, render_trace_html
from formline.trace.recorder import FAILURE_REASONS, _field_orders, _order_variants, byte_ranges

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def _check(smollm2_vocab):  # type: ignore[no-untyped-def]
    return compile_schema(SCHEMA, smollm2_vocab).check


def test_classify_names_every_failure_reason(smollm2_vocab) -> None:
    check = _check(smollm2_vocab)
    cases = {
        '{"name": "Ada", "age": 36}': (None, True),
        'Sure! {"name": "Ada", "age": 36}': ("text before the JSON", False),
        '{"name": "Ada", "age": "36"}': ("wrong type", True),
        '{"name": "Ada"}': ("missing field", True),
        '{"name": "Ad': ("stopped early", False),
        '{"name": "Ada", "age": 36,,}': ("syntax error", False),
    }
    for text, expected in cases.items():
        finish = "length" if text.endswith("Ad") else "stop"
        assert classify(text, finish, check) == expected, text
    assert {reason for reason, _ in cases.values() if reason} <= set(FAILURE_REASONS)


def test_byte_ranges_joins_runs_and_names_spaces() -> None:
    assert byte_ranges([]) == ""
    assert byte_ranges([0x22]) == '"'
    assert byte_ranges([0x20, 0x2D, *range(0x30, 0x3A)]) == "␣ - 0-9"
    assert byte_ranges([0x0A, 0x41, 0x42]) == "\\n A B"


def test_page_embeds_the_trace_safely() -> None:
    trace = {"prompt": "</script><script>alert(1)</script>", "constrained": {"steps": []}}
    page = render_trace_html(trace)
    assert "__TRACE_JSON__" not in page
    assert "</script><script>alert" not in page
    data = re.search(r'<script type="application/json" id="trace-data">(.*?)</script>', page, re.S)
    assert data is not None
    assert json.loads(data.group(1)) == trace
    # Self-contained: nothing fetched from anywhere.
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)


def test_the_added_evidence_field_takes_a_name_the_schema_does_not_use(llama_backend) -> None:
    # A schema's own integer "evidence" was replaced by the free-text one (required twice).
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8}, "evidence": {"type": "integer"}},
        "required": ["name", "evidence"],
    }
    variants = _order_variants(schema, llama_backend.vocabulary)
    orders = _field_orders(llama_backend, "Ada, evidence 3.", variants, 24, tqdm(disable=True))
    assert orders is not None and orders["added_field"] == "evidence_1"
    assert all({"evidence", "evidence_1"} <= set(row["order"]) for row in orders["rows"])


def test_classify_takes_replies_python_cannot_load(smollm2_vocab) -> None:
    # json.loads raised ValueError (an integer past Python's digit limit) and RecursionError
    # (deep nesting), neither a JSONDecodeError: the trace failed on one sampled reply.
    check = _check(smollm2_vocab)
    huge = '{"name": "Ada", "age": ' + "9" * 5000 + "}"
    assert classify(huge, "stop", check) == ("syntax error", False)
    assert classify("[" * 100_000, "length", check) == ("stopped early", False)


def test_an_order_variant_that_does_not_compile_skips_the_comparison(llama_backend) -> None:
    # The added required "evidence" field makes these schemas accept nothing: the trace
    # raised at its last step, after the whole recording, blaming the user's schema.
    name = {"type": "string", "maxLength": 12}
    base = {"properties": {"name": name, "age": {"type": "integer"}}, "required": ["name", "age"]}
    most_two = {"type": "object", **base, "maxProperties": 2}
    short_names = {"type": "object", **base, "propertyNames": {"maxLength": 4}}
    for schema in (most_two, short_names):
        variants = _order_variants(schema, llama_backend.vocabulary)
        assert variants.variants == [] and variants.added == "evidence"
        assert variants.note is not None and '"evidence"' in variants.note
    trace = record_trace(most_two, "Ada Lovelace, 36.", llama_backend, free_samples=1, max_tokens=8)
    assert trace["field_orders"] is None and "does not compile" in trace["field_orders_note"]
    assert len(trace["constrained"]["steps"]) >= 1  # the recording is kept
    assert _order_variants(SCHEMA, llama_backend.vocabulary).note is None
