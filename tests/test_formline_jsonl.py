"""``formline.jsonl``: a resumable JSON Lines file read by line number and mended after a
run killed mid-line, never cut when it is no JSON Lines file at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from formline.jsonl import mend_torn_end, read_numbered


def test_a_torn_last_line_is_cut_and_a_whole_one_keeps_its_record(tmp_path: Path) -> None:
    records = tmp_path / "out.jsonl"
    records.write_text('{"a": 1}\n{"b": "x\u2028y"}\n{"c": ')
    assert mend_torn_end(records) == len('{"c": ')
    assert records.read_text() == '{"a": 1}\n{"b": "x\u2028y"}\n'
    assert [value for _, value in read_numbered(records)] == [{"a": 1}, {"b": "x\u2028y"}]
    records.write_text('{"a": 1}\r\n{"b": 2}')  # CRLF, and a whole record without newline
    assert mend_torn_end(records) == 0 and records.read_text().endswith('{"b": 2}\n')
    assert [number for number, _ in read_numbered(records)] == [1, 2]


def test_a_file_that_is_not_json_lines_is_not_cut(tmp_path: Path) -> None:
    pretty = tmp_path / "result.json"
    pretty.write_text('{\n  "a": 1\n}')
    with pytest.raises(ValueError, match=r"result\.json:1: not a JSON line"):
        mend_torn_end(pretty)
    assert pretty.read_text() == '{\n  "a": 1\n}'
