"""The official JSON-Schema-Test-Suite as a ratchet for the schema compiler.

For every test group whose schema compiles, every instance is serialised compactly
(``json.dumps(..., separators=(",", ":"), ensure_ascii=False)``), tokenized canonically with
SmolLM2's real tokenizer and walked through a :class:`GrammarMatcher` token by token:

- a valid instance must be accepted and allowed to end;
- an invalid instance must be refused, unless the keyword that makes it invalid is in the
  report's checked-after list, and then :meth:`CompiledSchema.check` must catch it.

formline asserts ``format`` (the after-check runs ``jsonschema`` with ``FormatChecker``), so
an instance the suite calls valid only because "format is an annotation by default" is
expected to be refused. Each test gets an outcome string; the committed baseline
(``conformance_baseline.json``) is the ratchet. Update it after an improvement with::

    python3 tests/schema/conformance_suite.py --update
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
# The suite's copy in the repository (draft 2020-12 and draft 7; see its SOURCE.md).
SUITE = ROOT / "tests" / "data" / "json-schema-test-suite" / "tests"
BASELINE = Path(__file__).with_name("conformance_baseline.json")
DRAFTS = {
    "draft2020-12": "https://json-schema.org/draft/2020-12/schema",
    "draft7": "http://json-schema.org/draft-07/schema#",
}
PASS = "pass"
AFTER_CHECK_FAILED = "the after-check could not run"  # schema.api.SchemaCheck's finding


# The optional files on ECMA-262 patterns, which JSON Schema specifies (formline reads
# patterns as ECMA-262 in the grammar and in the after-check alike).
OPTIONAL = ("optional/ecmascript-regex.json", "optional/non-bmp-regex.json")


def suite_files(suite: Path = SUITE) -> Iterator[tuple[str, Path]]:
    """(draft, file) for the required tests, optional/format and the optional pattern files
    of both drafts."""
    for draft in DRAFTS:
        folder = suite / draft
        for path in sorted(folder.glob("*.json")) + sorted(folder.glob("optional/format/*.json")):
            yield draft, path
        for name in OPTIONAL:
            yield draft, folder / name


def with_draft(schema: Any, draft: str) -> Any:
    """The schema with ``$schema`` set when the suite left it implicit."""
    if isinstance(schema, dict) and "$schema" not in schema:
        return {"$schema": DRAFTS[draft], **schema}
    return schema


class Runner:
    """Runs groups against one vocabulary and its Hugging Face tokenizer."""

    def __init__(self, vocabulary: Any, tokenizer: Any, cache_directory: Path | bool = False):
        self.vocabulary = vocabulary
        self.tokenizer = tokenizer
        self.cache_directory = cache_directory

    def run_group(self, draft: str, group: dict[str, Any]) -> list[str]:
        """One outcome per test of ``group`` ("pass", or why not)."""
        from formline.schema import SchemaError, compile_schema

        schema = with_draft(group["schema"], draft)
        try:
            compiled = compile_schema(schema, self.vocabulary, disk_cache=self.cache_directory)
        except SchemaError as error:
            return [f"not compiled: {error}"[:160]] * len(group["tests"])
        return [self.run_test(compiled, test) for test in group["tests"]]

    def run_test(self, compiled: Any, test: dict[str, Any]) -> str:
        instance = test["data"]
        # The suite's valid instances the after-check refuses are not held against the
        # grammar (a format enforced as 2020-12 defines it, in an older draft). An after-check
        # that could not run refuses nothing: the grammar must still accept them.
        findings = compiled.check(instance)
        expected_valid = test["valid"] and not [
            finding for finding in findings if not finding.startswith(AFTER_CHECK_FAILED)
        ]
        accepted = self.is_accepted(compiled, compiled.serialize(instance))
        if expected_valid:
            return PASS if accepted else "valid refused"
        if not accepted:
            return PASS
        errors = compiled.check(instance)
        if not errors:
            return "invalid accepted, after-check passed it"
        after = {use.keyword for use in compiled.report.checked_after}
        after |= {use.keyword for use in compiled.report.unsupported}
        if _error_keywords(compiled, instance) & after:
            return PASS
        ignored = {use.keyword for use in compiled.report.ignored}
        if _error_keywords(compiled, instance) & ignored:
            return "invalid accepted, keyword reported ignored"
        return "invalid accepted, keyword claimed enforced"

    def is_accepted(self, compiled: Any, text: str) -> bool:
        """Walk the canonical tokens; text the tokenizer cannot round-trip walks as bytes."""
        matcher = compiled.matcher()
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if self.tokenizer.decode(ids) != text:
            return bool(matcher.accept_string(text.encode("utf-8"))) and matcher.can_end()
        for token_id in ids:
            if not matcher.accept_token(token_id):
                return False
        return bool(matcher.can_end())


def _error_keywords(compiled: Any, instance: Any) -> set[str]:
    """The keywords on the schema path of every error (nested anyOf/oneOf causes included):
    an error under ``then`` or ``dependentSchemas`` is that keyword's error."""
    from formline.schema.api import _validator
    from formline.schema.python_patterns import with_python_patterns

    keywords: set[str] = set()
    pending = list(_validator(with_python_patterns(compiled.schema)[0]).iter_errors(instance))
    while pending:
        error = pending.pop()
        keywords.update(str(part) for part in error.absolute_schema_path)
        pending.extend(error.context or [])
    return keywords


def run_suite(runner: Runner, suite: Path = SUITE) -> dict[str, str]:
    """Outcome per test id ``draft/file#group/test``."""
    outcomes: dict[str, str] = {}
    for draft, path in suite_files(suite):
        relative = path.relative_to(suite / draft).as_posix()
        for group_index, group in enumerate(json.loads(path.read_text())):
            for test_index, outcome in enumerate(runner.run_group(draft, group)):
                outcomes[f"{draft}/{relative}#{group_index}/{test_index}"] = outcome
    return outcomes


def summary(outcomes: dict[str, str]) -> Counter[str]:
    return Counter(
        "not compiled" if outcome.startswith("not compiled") else outcome
        for outcome in outcomes.values()
    )


def compare_with_baseline(outcomes: dict[str, str], baseline_path: Path, update: str) -> None:
    """Fail on a regression (a baseline pass that no longer passes), then on any other change
    (an improvement too, until ``update`` rewrites the baseline)."""
    baseline = json.loads(baseline_path.read_text())
    regressions = {
        key: (baseline.get(key), outcome)
        for key, outcome in outcomes.items()
        if baseline.get(key) == PASS and outcome != PASS
    }
    assert not regressions, f"{len(regressions)} regressions: {list(regressions.items())[:10]}"
    changed = {
        key for key in outcomes.keys() | baseline.keys() if outcomes.get(key) != baseline.get(key)
    }
    assert not changed, (
        f"{len(changed)} outcomes differ from the baseline (improvements?): "
        f"{sorted(changed)[:10]}; run {update}"
    )


def report_and_update(outcomes: dict[str, str], baseline_path: Path, arguments: list[str]) -> int:
    """Print the outcome counts; with ``--update`` write them as the new baseline."""
    for outcome, count in sorted(summary(outcomes).items()):
        print(f"{count:6d}  {outcome}")
    if "--update" in arguments:
        baseline_path.write_text(json.dumps(outcomes, indent=0, sort_keys=True) + "\n")
        print(f"wrote {baseline_path}")
    return 0


def default_runner() -> Runner:
    from transformers import AutoTokenizer

    from formline.vocab import Vocabulary
    from formline.vocab.fixtures import fixture_path

    path = fixture_path("smollm2")
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return Runner(Vocabulary.from_gguf(path), tokenizer)


def main(arguments: list[str]) -> int:
    sys.path.insert(0, str(ROOT / "src"))
    return report_and_update(run_suite(default_runner()), BASELINE, arguments)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
