"""The CLI with the real embedded model: output, exit codes, resumable batches."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from formline.cli.generation import output_spec
from formline.cli.main import build_parser, main

PERSON = Path(__file__).resolve().parents[2] / "examples" / "person.json"


def test_generate_prints_valid_json_and_exit_codes(capsys: Any) -> None:
    assert main(["generate", "--schema", str(PERSON), "Ada Lovelace, 36, lives in London."]) == 0
    value = json.loads(capsys.readouterr().out)
    assert set(value) == {"name", "age", "city"} and isinstance(value["age"], int)
    assert main(["generate", "--schema", str(PERSON), "Ada", "--max-tokens", "3"]) == 4
    assert "cut off" in capsys.readouterr().err
    assert main(["generate", "--schema", "/no/such/schema.json", "Ada"]) == 2
    assert main(["generate", "--choices", "yes,no", "Is water wet?"]) == 0
    assert capsys.readouterr().out.strip() in ("yes", "no")


def test_compile_schema_prints_the_keyword_report(capsys: Any, tmp_path: Path) -> None:
    schema = tmp_path / "s.json"
    schema.write_text(
        json.dumps({"type": "array", "items": {"type": "integer"}, "uniqueItems": True})
    )
    assert main(["compile", "--schema", str(schema)]) == 0
    out = capsys.readouterr().out
    assert "checked after decoding (1)" in out and "uniqueItems at /" in out
    schema.write_text(json.dumps({"type": "object", "properties": {"a": {"$ref": "#/nope"}}}))
    assert main(["compile", "--schema", str(schema)]) == 2
    assert "/properties/a" in capsys.readouterr().err


def test_extract_writes_one_line_per_input_and_resumes(tmp_path: Path, capsys: Any) -> None:
    documents = tmp_path / "docs.jsonl"
    rows = [
        {"id": "a", "text": "Lagos resident Chiamaka Eze turned 29 on Saturday."},
        {"id": "b", "text": "Mateus Carvalho, 34, sells fruit in Porto Alegre."},
    ]
    documents.write_text(json.dumps(rows[0]) + "\n")
    output = tmp_path / "out.jsonl"
    arguments = ["extract", "--schema", str(PERSON), "--input", str(documents)]
    assert main([*arguments, "--output", str(output)]) == 0
    documents.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert main([*arguments, "--output", str(output)]) == 0  # resumes: only "b" is new
    written = [json.loads(line) for line in output.read_text().splitlines()]
    assert [row["id"] for row in written] == ["a", "b"]
    assert all(row["finish_reason"] == "stop" and row["value"] for row in written)
    assert "1 written, 1 already there" in capsys.readouterr().err


def test_extract_with_the_repair_loop_records_attempts(tmp_path: Path) -> None:
    documents = tmp_path / "docs.jsonl"
    text = "Ada Lovelace, 36, lives in London."
    documents.write_text(json.dumps({"id": "a", "text": text}) + "\n")
    output = tmp_path / "out.jsonl"
    arguments = ["extract", "--schema", str(PERSON), "--input", str(documents)]
    assert main([*arguments, "--output", str(output), "--repair", "2", "--ground"]) == 0
    (row,) = [json.loads(line) for line in output.read_text().splitlines()]
    assert 1 <= row["attempts"] <= 2 and row["error"] is None and row["errors"] == []
    jsonschema.validate(row["value"], json.loads(PERSON.read_text()))
    # --ground: every string value is a span of the text (an ungrounded one is repaired).
    assert all(value in text for value in row["value"].values() if isinstance(value, str))
    alone = tmp_path / "alone.jsonl"  # --ground with one attempt still runs the checking loop
    assert main([*arguments, "--output", str(alone), "--ground", "--whitespace", "-1"]) == 0
    (row,) = [json.loads(line) for line in alone.read_text().splitlines()]
    assert row["attempts"] == 1 and "\n" not in row["text"]  # the model flags reach extract


def test_generate_verbatim_copies_the_values_from_the_prompt(capsys: Any) -> None:
    prompt = "Lagos resident Chiamaka Eze marked her 29th birthday with a dozen friends."
    assert main(["generate", "--schema", str(PERSON), "--verbatim", prompt]) == 0
    value = json.loads(capsys.readouterr().out)
    assert value["age"] in (29, 12)  # only the numbers the text states
    for field in ("name", "city"):
        assert value[field] in prompt  # a span of the text, whatever the model chose


def test_extract_resumes_rows_without_ids_past_a_torn_line(tmp_path: Path, capsys: Any) -> None:
    rows = ["Lagos resident Chiamaka Eze turned 29.", "Mateus Carvalho, 34, lives in Porto Alegre."]
    documents, output = tmp_path / "docs.jsonl", tmp_path / "out.jsonl"
    arguments = ["extract", "--schema", str(PERSON), "--input", str(documents)]
    # A "schema" field that is no file name is ignored with --schema FILE (not hashed).
    documents.write_text(json.dumps({"text": rows[0], "schema": {"x": 1}}) + "\n")
    assert main([*arguments, "--output", str(output)]) == 0
    with output.open("a") as sink:
        sink.write('{"id": null, "value": {"na')  # a run killed while writing line 2
    lines = [json.dumps({"text": text, "schema": {"x": 1}}) + "\n" for text in rows]
    documents.write_text("".join(lines))
    assert main([*arguments, "--output", str(output)]) == 0  # line 2 has no id: keyed by line
    err = capsys.readouterr().err
    assert "dropped a torn last line" in err and "1 written, 1 already there" in err
    written = [json.loads(line) for line in output.read_text().splitlines()]
    assert [row["line"] for row in written] == [1, 2] and all(row["value"] for row in written)


def test_extract_names_a_bad_input_line_before_loading_the_model(
    tmp_path: Path, capsys: Any
) -> None:
    documents = tmp_path / "docs.jsonl"
    arguments = ["extract", "--schema", str(PERSON), "--input", str(documents)]
    for lines, message in (
        (['{"id": "a", "text": "x"}', '{"id": "b"}'], 'docs.jsonl:2: no "text" string'),
        (['{"id": "a", "text": "x"}', '["x"]'], "docs.jsonl:2: a line must be a JSON object"),
        (['{"id": "a", "text": "x"}', '{"id": "a", "text": "y"}'], "'a' is already on line 1"),
    ):
        documents.write_text("\n".join(lines) + "\n")
        assert main([*arguments, "--output", str(tmp_path / "out.jsonl")]) == 2
        assert message in capsys.readouterr().err
    folder = tmp_path / "schemas"
    folder.mkdir()
    (folder / "bad.json").write_text("{not json")
    documents.write_text('{"id": "a", "text": "x", "schema": "bad.json"}\n')
    folder_arguments = ["extract", "--schema", str(folder), "--input", str(documents)]
    assert main([*folder_arguments, "--output", str(tmp_path / "out.jsonl")]) == 2
    assert "bad.json (line 1 of the input)" in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()  # named before the model loads: no output


def test_a_document_the_model_cannot_take_is_its_rows_error(tmp_path: Path, capsys: Any) -> None:
    # A document over the model's context ended the whole run, and every resume met it.
    documents = tmp_path / "docs.jsonl"
    rows = [
        {"id": "a", "text": "Lagos resident Chiamaka Eze turned 29 on Saturday."},
        {"id": "long", "text": "Ada Lovelace lived in London. " * 1500},  # over 8,192 tokens
        {"id": "c", "text": "Mateus Carvalho, 34, sells fruit in Porto Alegre."},
    ]
    documents.write_text("".join(json.dumps(row) + "\n" for row in rows))
    output = tmp_path / "out.jsonl"
    arguments = ["extract", "--schema", str(PERSON), "--input", str(documents)]
    assert main([*arguments, "--output", str(output)]) == 0
    written = {row["id"]: row for row in map(json.loads, output.read_text().splitlines())}
    assert list(written) == ["a", "long", "c"] and written["a"]["value"] and written["c"]["value"]
    assert written["long"]["value"] is None and "n_ctx" in written["long"]["error"]
    assert "3 written (1 with a model error)" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command",
    [
        ["generate", "--max-tokens", "0", "Ada"],
        ["generate", "--temperature", "-1", "Ada"],
        ["generate", "--top-p", "5", "Ada"],
        ["generate", "--top-p", "0", "Ada"],
        ["eval", "--max-tokens", "0"],  # it ran, and reported every rate as 0%
        ["trace", "--schema", "s.json", "--free-samples", "-2", "Ada"],
        ["trace", "--schema", "s.json", "--temperature", "-1", "Ada"],
    ],
)
def test_out_of_range_model_flags_are_usage_errors(command: list[str], capsys: Any) -> None:
    with pytest.raises(SystemExit) as caught:
        main(command)
    flag = next(word for word in command if word.startswith("--") and word != "--schema")
    assert caught.value.code == 2 and flag in capsys.readouterr().err


def test_demo_and_compile_read_the_embedded_models_vocabulary(
    monkeypatch: Any, tmp_path: Path, capsys: Any
) -> None:
    # They read the test fixtures' cache, which a user's machine does not have.
    monkeypatch.setenv("FORMLINE_CACHE_DIR", str(tmp_path / "empty"))
    assert main(["demo"]) == 0
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "integer"}))
    assert main(["compile", "--schema", str(schema)]) == 0
    assert "fixture" not in capsys.readouterr().err


def test_an_empty_regex_is_a_constraint_and_an_empty_choice_an_error() -> None:
    # Both tests were truthiness: --regex '' generated free text, "a,,b" added "".
    regex = build_parser().parse_args(["generate", "--regex", "", "hi"])
    assert output_spec(regex) is not None
    choices = build_parser().parse_args(["generate", "--choices", "a,,b", "hi"])
    with pytest.raises(SystemExit, match="empty option"):
        output_spec(choices)


def test_demo_max_tokens_below_one_is_a_usage_error(capsys: Any) -> None:
    with pytest.raises(SystemExit) as caught:  # it ran and printed "mask p50 nan µs"
        main(["demo", "--max-tokens", "0"])
    assert caught.value.code == 2 and "--max-tokens" in capsys.readouterr().err
