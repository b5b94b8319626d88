"""The schema compiler's modules compiled by Cython (``formline._accelerated``): loaded when
they match their source, left for the source with a warning when they do not, and giving
the same grammars and reports as the Python source."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import formline.grammar.ir
import formline.grammar.nodes
import formline.schema.compiler
from formline import _accelerated
from formline.schema.api import schema_to_grammar

SAMPLE = Path(__file__).resolve().parent / "data" / "maskbench"
PURE = os.environ.get("FORMLINE_PURE_PYTHON") == "1"

# Prints, for every schema of the sample and both ways of meeting an unsupported keyword, its
# grammar's fingerprint and its report (or its error), and which of two modules ran compiled.
COMPILE_SAMPLE = """
import json, sys
from pathlib import Path
import formline.schema.compiler, formline.grammar.ir
from formline import _accelerated
from formline.mask.compiler import CompileCache
from formline.schema import SchemaError
from formline.schema.api import schema_to_grammar
results = {}
for path in sorted(Path(sys.argv[1]).glob("*.json")):
    data = json.loads(path.read_text())
    for mode in ("error", "check_after"):
        try:
            grammar, report = schema_to_grammar(
                data.get("schema", data), on_unsupported=mode, cache=CompileCache(disk_cache=False)
            )
            results[f"{path.stem} {mode}"] = [grammar.fingerprint(), report.to_dict()]
        except SchemaError as error:
            results[f"{path.stem} {mode}"] = ["error", str(error)]
modules = (formline.schema.compiler, formline.grammar.ir)
print(json.dumps({"compiled": [_accelerated.is_compiled(m) for m in modules], "results": results}))
"""


def run_python(code: str, *arguments: str, **environment: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-W", "always", "-c", code, *arguments],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **environment},
        check=True,
    )


@pytest.mark.skipif(PURE, reason="FORMLINE_PURE_PYTHON=1 asks for the Python source")
def test_the_schema_compiler_runs_compiled_after_an_install() -> None:
    finder = _accelerated.FINDER
    assert finder is not None
    # pip install (or install -e) compiles every module of both packages.
    built = {
        "formline.schema.compiler",
        "formline.schema.objects",
        "formline.grammar.ir",
        "formline.grammar.nodes",
    }
    assert built <= set(finder.candidates)
    stale = [
        name
        for name in finder.candidates
        if name in sys.modules and not _accelerated.is_compiled(sys.modules[name])
    ]
    assert stale == [], f"edited since the last pip install -e .: {stale}"
    assert _accelerated.is_compiled(formline.schema.compiler)
    assert _accelerated.is_compiled(formline.grammar.ir)
    assert _accelerated.is_compiled(formline.grammar.nodes)  # its digest reads nodes.pxd too


@pytest.mark.skipif(PURE, reason="FORMLINE_PURE_PYTHON=1 asks for the Python source")
def test_an_edited_source_runs_from_python_with_a_warning(tmp_path: Path) -> None:
    copy = tmp_path / "formline"
    shutil.copytree(_accelerated.PACKAGE_ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    with (copy / "schema" / "merge.py").open("a") as source:
        source.write("\n# an edit after the build\n")
    shown = run_python(
        "import formline.schema.merge as merge, formline.schema.objects as objects\n"
        "from formline._accelerated import is_compiled\n"
        "print(is_compiled(merge), is_compiled(objects), merge.__file__, objects.__file__)",
        PYTHONPATH=str(tmp_path),
    )
    merge_compiled, objects_compiled, merge_file, objects_file = shown.stdout.split()
    assert (merge_compiled, objects_compiled) == ("False", "True")
    assert merge_file == str(copy / "schema" / "merge.py")
    assert Path(objects_file).parent == copy / "_accelerated" / "schema"
    assert "StaleCompiledModule" in shown.stderr
    assert "formline.schema.merge runs from its Python source" in shown.stderr
    assert "formline.schema.objects runs from" not in shown.stderr


def test_the_finder_reads_only_its_own_file_names(tmp_path: Path) -> None:
    package = tmp_path / "formline"
    (package / "schema").mkdir(parents=True)
    source = package / "schema" / "values.py"
    source.write_text("x = 1\n")
    compiled = tmp_path / "compiled" / "schema"
    compiled.mkdir(parents=True)
    digest = _accelerated.source_digest(source)
    suffix = _accelerated.EXTENSION_SUFFIX
    for name in (f"values_{digest}{suffix}", f"values{suffix}", f"other_12{suffix}", "x.txt"):
        (compiled / name).write_bytes(b"")
    finder = _accelerated.CompiledModuleFinder(package, tmp_path / "compiled")
    assert finder.candidates == {"formline.schema.values": [compiled / f"values_{digest}{suffix}"]}
    assert finder.compiled_path("formline.schema.values") == compiled / f"values_{digest}{suffix}"
    source.write_text("x = 2\n")
    with pytest.warns(_accelerated.StaleCompiledModule, match="formline.schema.values"):
        assert finder.compiled_path("formline.schema.values") is None
    source.unlink()
    assert finder.compiled_path("formline.schema.values") is None
    assert finder.compiled_path("formline.schema.objects") is None


def test_a_declarations_file_beside_the_source_is_part_of_its_digest(tmp_path: Path) -> None:
    source = tmp_path / "nodes.py"
    source.write_text("x = 1\n")
    alone = _accelerated.source_digest(source)
    declarations = tmp_path / "nodes.pxd"
    declarations.write_text("cdef class Node:\n    pass\n")
    declared = _accelerated.source_digest(source)
    declarations.write_text("cdef class Node:\n    cdef object x\n")
    edited = _accelerated.source_digest(source)
    assert len({alone, declared, edited}) == 3
    declarations.unlink()
    assert _accelerated.source_digest(source) == alone


# Writes and deletes every field of every kind of grammar node; prints whether each was
# refused as immutable, the nodes as written, and whether the module ran compiled.
WRITE_NODES = """
import json
import formline.grammar.nodes as nodes
from formline import _accelerated
from formline.grammar.nodes import (
    EMPTY, ByteSet, Choice, Except, Literal, Minimized, Repeat, RuleReference, Sequence,
)
item = Literal(b"a")
made = [
    ByteSet(((48, 57),)), item, Sequence((item, ByteSet(((48, 57),)))), Choice((item, EMPTY)),
    Repeat(item, 2, 5), RuleReference("rule"), Except(item, (b"x", b"x")), Minimized(item),
]
refused = []
for node in made:
    for name in (*node.field_names, "_hash", "_size"):
        for change in (lambda: setattr(node, name, None), lambda: delattr(node, name)):
            try:
                change()
                refused.append(f"{name} changed")
            except AttributeError as error:
                refused.append("immutable" in str(error))
descriptor = type(Literal.__dict__["value"]).__name__
print(json.dumps({
    "compiled": _accelerated.is_compiled(nodes),
    "descriptor": descriptor,
    "refused": refused,
    "nodes": [[repr(node), node._size, node == eval(repr(node), vars(nodes))] for node in made],
}))
"""


@pytest.mark.skipif(PURE, reason="FORMLINE_PURE_PYTHON=1: both sides would be the source")
def test_grammar_nodes_refuse_writes_compiled_as_c_types_and_from_source() -> None:
    compiled = json.loads(run_python(WRITE_NODES).stdout)
    pure = json.loads(run_python(WRITE_NODES, FORMLINE_PURE_PYTHON="1").stdout)
    assert (compiled["compiled"], pure["compiled"]) == (True, False)
    # nodes.pxd applied: C members (getset), not the slots of the source's classes
    assert (compiled["descriptor"], pure["descriptor"]) == (
        "getset_descriptor",
        "member_descriptor",
    )
    assert (
        compiled["refused"] == pure["refused"] == [True] * 2 * (1 + 1 + 1 + 1 + 3 + 1 + 2 + 1 + 16)
    )
    assert compiled["nodes"] == pure["nodes"]
    sizes = [size for _, size, _ in pure["nodes"]]
    assert sizes == [1, 1, 2, 2, 5, 1, 2, 1]
    assert all(equal for _, _, equal in pure["nodes"])


@pytest.mark.skipif(PURE, reason="FORMLINE_PURE_PYTHON=1: both sides would be the source")
def test_compiled_and_python_source_give_the_same_grammars_and_reports() -> None:
    compiled = json.loads(run_python(COMPILE_SAMPLE, str(SAMPLE)).stdout)
    pure = json.loads(run_python(COMPILE_SAMPLE, str(SAMPLE), FORMLINE_PURE_PYTHON="1").stdout)
    assert pure["compiled"] == [False, False]
    assert compiled["compiled"] == [True, True]
    assert len(pure["results"]) == 2 * 300
    assert compiled["results"] == pure["results"]
    errors = [name for name, (fingerprint, _) in pure["results"].items() if fingerprint == "error"]
    assert 0 < len(errors) < 20  # the schemas declined for an unsupported keyword
    assert all(name.endswith(" error") for name in errors)
    assert len({fingerprint for fingerprint, _ in pure["results"].values()}) > 250


@pytest.mark.skipif(PURE, reason="FORMLINE_PURE_PYTHON=1: both sides would be the source")
def test_this_process_agrees_with_the_python_source_on_one_schema() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 3}}}
    grammar, report = schema_to_grammar(schema)
    code = (
        "import json, sys\nfrom formline.schema.api import schema_to_grammar\n"
        "grammar, report = schema_to_grammar(json.loads(sys.argv[1]))\n"
        "print(grammar.fingerprint())\nprint(json.dumps(report.to_dict()))"
    )
    shown = run_python(code, json.dumps(schema), FORMLINE_PURE_PYTHON="1").stdout.splitlines()
    assert shown == [grammar.fingerprint(), json.dumps(report.to_dict())]
