"""The canonical JSON text of a value: what the grammar produces for an enum or a name."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from formline.schema.json_text import compact_json


@given(st.text())
def test_a_string_is_spelled_as_json_dumps_spells_it(text: str) -> None:
    expected = json.dumps(text, separators=(",", ":"), ensure_ascii=False)
    assert compact_json(text) == expected.encode("utf-8", "backslashreplace")
    assert json.loads(compact_json(text).decode("utf-8")) == text


def test_a_lone_surrogate_is_written_as_its_escape() -> None:
    assert compact_json("a\ud800") == b'"a\\ud800"'
    assert json.loads(compact_json("a\ud800")) == "a\ud800"


def test_values_other_than_strings_are_compact() -> None:
    value = {"b": [1, 2.5, True, None], "a": "é"}
    assert compact_json(value) == '{"b":[1,2.5,true,null],"a":"é"}'.encode()
    assert compact_json(1e20) == b"1e+20"
