"""``import formline`` defers rfc3987_syntax's parser (``formline._deferred``) and the iri
checks give jsonschema's own answers. Each case runs in a fresh interpreter: what is imported
first is the point."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

VALUES = [
    "http://example.com/ü",
    "https://例え.テスト/パス?q=1#frag",
    "urn:isbn:0451450523",
    "//example.com/relative",
    "http://[bad",
    "a b",
    "",
]

# The verdicts of the draft 2020-12 format checker on VALUES, for both formats, and what
# rfc3987_syntax is in sys.modules before and after.
CHECK = """
import json, sys
FIRST
before = type(sys.modules.get("rfc3987_syntax")).__name__
helpers_before = "rfc3987_syntax.syntax_helpers" in sys.modules
from jsonschema import Draft202012Validator
values = json.loads(sys.argv[1])
checker = Draft202012Validator.FORMAT_CHECKER
verdicts = {
    name: [Draft202012Validator({"format": name}, format_checker=checker).is_valid(value)
           for value in values]
    for name in ("iri", "iri-reference")
}
after = type(sys.modules.get("rfc3987_syntax")).__name__
print(json.dumps([before, helpers_before, verdicts, after]))
"""


def run_check(first: str) -> list:
    shown = subprocess.run(
        [sys.executable, "-c", CHECK.replace("FIRST", first), json.dumps(VALUES)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(shown.stdout)


# jsonschema prefers the GPL rfc3987 package when it is installed and never reads the stand-in.
@pytest.mark.skipif(importlib.util.find_spec("rfc3987") is not None, reason="rfc3987 installed")
def test_import_formline_defers_the_parser_and_the_iri_checks_do_not_change() -> None:
    assert importlib.util.find_spec("rfc3987_syntax") is not None  # jsonschema[format-nongpl]
    before, helpers_before, verdicts, after = run_check("import formline")
    assert (before, helpers_before, after) == ("DeferredModule", False, "module")
    alone = run_check("pass")  # jsonschema without formline: the real module at its import
    assert (alone[0], alone[1], alone[3]) == ("NoneType", False, "module")
    assert verdicts == alone[2]
    assert verdicts["iri"] == [True, True, True, False, False, False, False]
    assert verdicts["iri-reference"][3] is True


def test_the_stand_in_gives_every_attribute_of_the_real_module() -> None:
    code = (
        "import sys, formline, rfc3987_syntax as stand_in\n"
        "kind = type(stand_in).__name__\n"
        "real = formline._deferred.load()\n"
        "names = [name for name in vars(real) if not name.startswith('_')]\n"
        "apart = [name for name in names if getattr(stand_in, name) is not getattr(real, name)]\n"
        "print(kind, type(real).__name__, len(names), apart == ['is_valid_syntax'],"
        " stand_in.is_valid_syntax_iri('http://a.b/'), formline._deferred.DEFERRED)"
    )
    shown = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    kind, real, count, only_the_wrapper_apart, checked, deferred = shown.stdout.split()
    assert (kind, real, only_the_wrapper_apart, checked, deferred) == (
        "DeferredModule",
        "module",
        "True",
        "True",
        "True",
    )
    assert int(count) > 40  # the module's is_valid_syntax_* checkers, its parser, ...


def test_nothing_is_deferred_when_jsonschema_was_imported_first() -> None:
    before, helpers_before, _, after = run_check("import jsonschema, formline")
    assert (before, helpers_before, after) == ("module", True, "module")
