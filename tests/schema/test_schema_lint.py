"""``formline lint``: each check fires on a minimal schema and its suggested fix silences it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field

from formline.cli.main import main
from formline.schema import lint
from formline.schema.lint import LintFinding, lint_schema


def obj(properties: dict[str, Any], required: list[str] | None = None, **extra: Any) -> Any:
    """A closed object, every property required unless ``required`` says otherwise."""
    required = list(properties) if required is None else required
    schema = {"type": "object", "properties": properties, "required": required}
    return {**schema, "additionalProperties": False, **extra}


def found(schema: Any, provider: str | None = None) -> set[tuple[str, str]]:
    return {(f.code, f.pointer) for f in lint_schema(schema, provider)}


def codes(schema: Any, provider: str | None = None) -> set[str]:
    return {f.code for f in lint_schema(schema, provider)}


SHORT = {"type": "string", "maxLength": 200}
CATEGORY = ["billing", "bug", "feature_request"]

# code, pointer, the schema it flags, the same schema with the suggested fix
QUALITY_CASES = [
    (
        "FL001",
        "/properties/category",
        obj({"category": {"type": "string", "enum": CATEGORY}}),
        obj(
            {
                "category": {"type": "string", "enum": [*CATEGORY, "other"]},
                "other_reason": {"type": ["string", "null"], "maxLength": 200},
            }
        ),
    ),
    (
        "FL002",
        "/properties/notice_days",
        obj({"notice_days": {"type": "integer"}}),
        obj({"notice_days": {"type": ["integer", "null"]}}),
    ),
    (
        "FL002",
        "/properties/start",
        obj({"start": {"type": "string", "format": "date", "description": "start, if stated"}}),
        obj({"start": {"type": ["string", "null"], "format": "date", "description": "if stated"}}),
    ),
    (
        "FL003",
        "/properties/answer",
        obj({"answer": {"type": "integer"}, "reasoning": SHORT}),
        obj({"reasoning": SHORT, "answer": {"type": "integer"}}),
    ),
    (
        "FL004",
        "/properties/name",
        obj({"name": {"type": "string"}}),
        obj({"name": SHORT}),
    ),
    (
        "FL005",
        "/properties/tags",
        obj({"tags": {"type": "array", "items": SHORT}}),
        obj({"tags": {"type": "array", "items": SHORT, "maxItems": 8}}),
    ),
]


@pytest.mark.parametrize(("code", "pointer", "bad", "fixed"), QUALITY_CASES)
def test_each_quality_check_fires_and_its_fix_silences_it(
    code: str, pointer: str, bad: Any, fixed: Any
) -> None:
    findings = [f for f in lint_schema(bad) if f.code == code]
    assert [(f.pointer, f.severity) for f in findings] == [(pointer, "warning")]
    assert findings[0].fix and findings[0].message
    assert lint_schema(fixed) == []


SGR = obj(
    {
        "evidence": {"type": "array", "items": {"type": "string", "maxLength": 300}, "maxItems": 5},
        "reasoning": {"type": "string", "maxLength": 1000},
        "notice_days": {"type": ["integer", "null"], "description": "in days, if stated"},
        "currency": {"type": "string", "enum": ["EUR", "USD", "other"]},
        "other_reason": {"type": ["string", "null"], "maxLength": 200},
        "phone": {"anyOf": [{"type": "string", "pattern": "^[0-9+ ]{3,20}$"}, {"type": "null"}]},
        "final_answer": {"type": "string", "enum": ["approve", "reject", "unclear"]},
        "score": {"type": "integer"},
    }
)


def test_an_sgr_schema_is_clean() -> None:
    assert lint_schema(SGR) == []
    assert lint_schema(SGR, "openai") == []
    # Anthropic drops length bounds: the only findings, as errors, name maxLength.
    anthropic = lint_schema(SGR, "anthropic")
    assert {(f.code, f.severity) for f in anthropic} == {("FL203", "error")}
    assert all("maxLength" in f.message for f in anthropic)


def test_heuristics_do_not_flag_everything() -> None:
    plain = obj({"name": SHORT, "age": {"type": "integer"}, "category": SHORT})
    assert lint_schema(plain) == []  # required facts without a hint: not FL002
    # the escape value may be spelled many ways; a one-value enum is a discriminator
    for escape in ("Other", "unknown", "N/A", "not stated", "other_issue"):
        assert lint_schema(obj({"kind": {"enum": ["a", "b", escape]}})) == []
    assert lint_schema(obj({"tool": {"type": "string", "enum": ["respond"]}})) == []
    # a reason field after its enum is the FL001 fix, not reasoning after a decision
    assert lint_schema(obj({"category": {"enum": ["a", "other"]}, "other_reason": SHORT})) == []
    # camelCase names split into words; a name with both kinds counts as reasoning
    camel = obj({"finalAnswer": SHORT, "evidenceQuotes": SHORT, "scoreRationale": SHORT})
    assert found(camel) == {("FL003", "/properties/finalAnswer")}


def test_nullable_forms_silence_fl001_and_fl002() -> None:
    kind = {"type": "string", "enum": ["a", "b"]}
    nullable = obj(
        {
            "kind": {"anyOf": [{"$ref": "#/$defs/Kind"}, {"type": "null"}]},
            "email": {"type": "string", "format": "email", "nullable": True},
            "deadline": {"enum": ["2025-01-01", None]},
        },
        **{"$defs": {"Kind": kind}},
    )
    assert lint_schema(nullable) == []
    direct = obj({"kind": {"$ref": "#/$defs/Kind"}}, **{"$defs": {"Kind": kind}})
    assert found(direct) == {("FL001", "/$defs/Kind")}


def test_refs_defs_and_cycles_are_walked_with_pointers() -> None:
    tree = obj(
        {"label": SHORT, "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
        **{"$defs": {"Node": obj({"kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}})}},
    )
    assert found(tree) == {
        ("FL005", "/properties/children"),
        ("FL005", "/$defs/Node/properties/kids"),
        ("FL201", "/$defs/Node/properties/kids/items"),
    }
    root_cycle = obj({"child": {"$ref": "#"}, "note": SHORT})
    assert found(root_cycle) == {("FL201", "/properties/child")}
    unused = obj({"a": SHORT}, **{"definitions": {"Unused": {"type": "string"}}})
    assert found(unused) == {("FL004", "/definitions/Unused")}


def test_openai_strict_mode_checks() -> None:
    loose = {
        "type": "object",
        "properties": {
            "a": SHORT,
            "b": {"allOf": [SHORT]},
            "c": {"type": "integer", "if": {"minimum": 1}, "then": {"maximum": 9}},
        },
        "required": ["b", "c"],
    }
    assert found(loose, "openai") == {
        ("FL102", ""),
        ("FL101", "/properties/a"),
        ("FL106", "/properties/b"),
        ("FL106", "/properties/c"),
    }
    assert {f.severity for f in lint_schema(loose, "openai")} == {"error"}
    assert {f.severity for f in lint_schema(loose) if f.code.startswith("FL1")} == {"warning"}
    assert [f.code for f in lint_schema(loose, "openai") if "'if'" in f.message] == ["FL106"]
    assert found({"anyOf": [obj({"a": SHORT}), obj({"b": SHORT})]}, "openai") == {
        ("FL107", ""),
    }
    deep: Any = SHORT
    for _ in range(10):
        deep = obj({"x": deep})
    assert found(deep, "openai") == set()  # properties 10 levels down: allowed
    assert found(obj({"x": deep}), "openai") == {("FL104", "/properties/x" * 10)}


def test_openai_totals(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lint, "OPENAI_MAX_PROPERTIES", 3)
    monkeypatch.setattr(lint, "OPENAI_MAX_ENUM_VALUES", 4)
    inner = obj({"p": SHORT, "q": SHORT})
    schema = obj({"one": inner, "two": {"enum": ["a", "b", "other"]}, "three": inner})
    assert codes(schema, "openai") == {"FL103"}  # 3 + 2 + 2 properties > 3
    schema["properties"]["four"] = {"enum": ["x", "y", "none"]}
    schema["required"].append("four")
    assert codes(schema, "openai") == {"FL103", "FL105"}


def test_anthropic_checks() -> None:
    schema = obj(
        {
            "n": {"type": "number", "minimum": 0, "multipleOf": 0.5},
            "name": {"type": "string", "minLength": 1, "maxLength": 80},
            "tags": {"type": "array", "items": SHORT, "minItems": 2, "maxItems": 4},
            "one": {"type": "array", "items": SHORT, "minItems": 1, "maxItems": 4},
            "note": SHORT,
            "open": {"type": "object", "properties": {}},
        },
        required=["n", "name", "tags", "one", "open"],
    )
    findings = {(f.code, f.pointer): f.severity for f in lint_schema(schema, "anthropic")}
    assert findings == {
        ("FL202", "/properties/n"): "error",
        ("FL203", "/properties/name"): "error",
        ("FL203", "/properties/tags/items"): "error",
        ("FL203", "/properties/one/items"): "error",
        ("FL203", "/properties/note"): "error",
        ("FL204", "/properties/tags"): "error",
        ("FL205", "/properties/open"): "error",
        ("FL206", "/properties/note"): "warning",  # a reordering, not a rejection
    }
    assert not codes(schema, "openai") & {"FL202", "FL204", "FL205"}
    assert "FL203" not in codes(schema)  # by default maxLength is FL004's advice


def test_anthropic_totals() -> None:
    many_optional = obj({f"p{i}": SHORT for i in range(25)}, required=[])
    assert {"FL207"} <= codes(many_optional, "anthropic")
    assert "FL207" not in codes(obj({f"p{i}": SHORT for i in range(24)}, required=[]))
    unions = obj({f"u{i}": {"type": ["integer", "null"]} for i in range(17)})
    assert codes(unions, "anthropic") == {"FL208"}
    assert codes(obj({f"u{i}": {"type": ["integer", "null"]} for i in range(16)})) == set()


def test_a_schema_formline_cannot_compile_is_an_error() -> None:
    broken = obj({"a": {"$ref": "#/nope"}})
    errors = [f for f in lint_schema(broken) if f.severity == "error"]
    assert [(f.code, f.pointer) for f in errors] == [("FL000", "/properties/a")]
    assert "does not resolve" in errors[0].message
    assert lint_schema(True) == []
    root_ref = {"$ref": "#/$defs/A", "$defs": {"A": obj({"a": SHORT})}}
    assert lint_schema(root_ref, "openai") == []
    with pytest.raises(ValueError, match="provider"):
        lint_schema(SGR, "gemini")


def test_pydantic_models_and_json_text_are_accepted() -> None:
    class Evaluation(BaseModel):
        model_config = ConfigDict(extra="forbid")
        verdict: Literal["hire", "reject", "hold"]
        rationale: str = Field(max_length=500)

    assert found(Evaluation) == {
        ("FL001", "/properties/verdict"),
        ("FL003", "/properties/verdict"),
    }
    assert lint_schema(json.dumps(SGR)) == []
    finding = lint_schema(Evaluation)[0]
    assert isinstance(finding, LintFinding)
    assert set(finding.to_dict()) == {"code", "severity", "pointer", "message", "fix"}


def test_cli_text_json_and_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "schema.json"
    path.write_text(json.dumps({"type": "object", "properties": {"answer": {"type": "string"}}}))
    assert main(["lint", str(path)]) == 0  # warnings only
    lines = capsys.readouterr().out.splitlines()
    assert "warning FL004 /properties/answer: string without maxLength" in lines[0]
    assert all(" fix: " in line for line in lines) and len(lines) == 4  # FL004 101 102 205
    assert main(["lint", str(path), "--provider", "openai", "--json"]) == 1
    rows = json.loads(capsys.readouterr().out)
    assert {(row["code"], row["severity"]) for row in rows} == {
        ("FL004", "warning"),
        ("FL101", "error"),
        ("FL102", "error"),
    }
    path.write_text(json.dumps(SGR))
    assert main(["lint", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    path.write_text(json.dumps({"type": "object", "properties": {"a": {"$ref": "#/x"}}}))
    assert main(["lint", str(path)]) == 1
    assert "error FL000 /properties/a" in capsys.readouterr().out
    path.write_text("{not json")
    assert main(["lint", str(path)]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert main(["lint", str(tmp_path / "missing.json")]) == 2
