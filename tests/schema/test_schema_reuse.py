"""A sub-schema met again is compiled once (schema/reuse.py): the same language, the same
report and the same errors as compiling it again at every place."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from formline.grammar.budget import CompileBudget
from formline.parser.pushdown import build_pushdown
from formline.schema import SchemaError
from formline.schema.compiler import SchemaCompiler, SchemaOptions
from formline.schema.reuse import SubschemaMemo, moved

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "maskbench"


def compile_schema(schema: Any, options: SchemaOptions | None = None) -> SchemaCompiler:
    compiler = SchemaCompiler(schema, options or SchemaOptions(), CompileBudget().start())
    compiler.grammar()
    return compiler


def without_reuse(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SubschemaMemo, "find", lambda *arguments: None)


def test_siblings_of_any_of_are_compiled_once_and_reported_at_every_branch() -> None:
    name = {"type": "string", "maxLength": 3}
    schema = {
        "type": "object",
        "properties": {"name": name},
        "anyOf": [{"required": ["name"]}, {"properties": {"x": {"type": "integer"}}}],
    }
    compiler = compile_schema(schema)
    compiled_at = [
        entry.pointer for entry in compiler.memo._entries.values() if entry.schema is name
    ]
    assert compiled_at == ["/anyOf/0/properties/name"]
    enforced = {(use.keyword, use.pointer) for use in compiler.report.enforced}
    assert ("maxLength", "/anyOf/0/properties/name") in enforced
    assert ("maxLength", "/anyOf/1/properties/name") in enforced
    automaton = build_pushdown(compiler.grammar())
    assert automaton.matches(b'{"name":"abc"}')
    assert automaton.matches(b'{"x":1}')
    assert not automaton.matches(b'{"name":"abcd"}')


def test_a_reused_sub_schema_still_counts_its_nesting() -> None:
    common = {"type": "object", "properties": {"a": {"type": "integer"}}}
    definitions = {"r1": {"$ref": "#/$defs/r2"}, "r2": {"$ref": "#/$defs/r3"}, "r3": common}
    schema = {
        "$defs": definitions,
        "type": "object",
        "properties": {"p": common, "q": {"$ref": "#/$defs/r1"}},
    }
    # "common" first at depth 1 (its "a" at 2), then through three $ref at depth 4 (its
    # "a" at 5); the JSON itself nests 5 levels, under check_nesting's 2 x max_depth.
    compile_schema(schema, SchemaOptions(max_depth=5))
    with pytest.raises(SchemaError, match="nested deeper than 4"):
        compile_schema(schema, SchemaOptions(max_depth=4))


def test_pointers_move_only_under_the_first_place() -> None:
    assert moved("/a/properties/x", "/a", "/b/c") == "/b/c/properties/x"
    assert moved("/a", "/a", "/b") == "/b"
    assert moved("/ab/x", "/a", "/b") == "/ab/x"  # not under /a
    assert moved("/$defs/t/type", "/a", "/b") == "/$defs/t/type"  # a $ref's target stays


@pytest.mark.parametrize("on_unsupported", ["error", "check_after"])
def test_sample_reports_and_languages_match_compiling_again(
    monkeypatch: pytest.MonkeyPatch, on_unsupported: str
) -> None:
    """Every schema of the MaskBench sample: the report (or the error) with reuse equals the
    one compiled without it, and both grammars decide every instance alike."""
    options = SchemaOptions(on_unsupported=on_unsupported)
    compared = 0
    found: list[bool] = []
    find = SubschemaMemo.find

    def counted(self: SubschemaMemo, *arguments: Any) -> Any:
        reused = find(self, *arguments)
        found.append(reused is not None)
        return reused

    for path in sorted(SAMPLE.glob("*.json")):
        case = json.loads(path.read_text())
        outcomes = []
        for memo in (True, False):
            with monkeypatch.context() as patch:
                if memo:
                    patch.setattr(SubschemaMemo, "find", counted)
                else:
                    without_reuse(patch)
                try:
                    compiler = compile_schema(case["schema"], options)
                except SchemaError as error:
                    outcomes.append((str(error), None))
                    continue
                outcomes.append((compiler.report.to_dict(), build_pushdown(compiler.grammar())))
        (report, automaton), (again, reference) = outcomes
        assert report == again, path.name
        if automaton is None or reference is None:
            continue
        for test in case["tests"]:
            text = json.dumps(test["data"], separators=(",", ":"), ensure_ascii=False).encode()
            assert automaton.matches(text) == reference.matches(text), (path.name, test)
        compared += 1
    assert compared >= 290 and sum(found) > 400  # 807 sub-schemas reused in the sample
