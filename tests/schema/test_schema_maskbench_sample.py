"""MaskBench (real-world schemas with valid and invalid instances) as a ratchet, like the
conformance suite: every instance's outcome must equal the committed baseline
(``maskbench_baseline.json``). A regression fails; so does an improvement until the baseline
is updated (``python3 tests/schema/test_schema_maskbench_sample.py --update``), so the
baseline always says exactly what formline passes. Timing lives in ``python -m
bench.maskbench``, never here.

The data is the repository's MaskBench sample, ``tests/data/maskbench/`` (300 files,
stratified over the subsets; see its SOURCE.md). The ratchet walks every ``SAMPLE_STEP``-th
file by sorted name, each instance in the schema's property order along SmolLM2's canonical
tokenization (``conformance_suite.Runner``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from conformance_suite import Runner, compare_with_baseline, default_runner, report_and_update

MASKBENCH = Path(__file__).resolve().parents[1] / "data" / "maskbench"
BASELINE = Path(__file__).resolve().parent / "maskbench_baseline.json"
SAMPLE_STEP = 1  # all 300 files: about 1.5 minutes on 2 cores


def sample_files() -> list[Path]:
    return sorted(MASKBENCH.glob("*.json"))[::SAMPLE_STEP]


def run_sample(runner: Runner) -> dict[str, str]:
    """Outcome per ``file#test``."""
    outcomes: dict[str, str] = {}
    for path in sample_files():
        document = json.loads(path.read_text(encoding="utf-8"))
        for index, outcome in enumerate(runner.run_group("draft2020-12", document)):
            outcomes[f"{path.name}#{index}"] = outcome
    return outcomes


@pytest.fixture(scope="module")
def outcomes(smollm2_vocab: Any, smollm2_tokenizer: Any) -> dict[str, str]:
    return run_sample(Runner(smollm2_vocab, smollm2_tokenizer))


def test_the_sample_is_in_the_repository() -> None:
    assert len(sorted(MASKBENCH.glob("*.json"))) >= 250, f"the MaskBench sample at {MASKBENCH}"
    assert len(sample_files()) >= 250


def test_outcomes_match_the_baseline(outcomes: dict[str, str]) -> None:
    compare_with_baseline(
        outcomes, BASELINE, "python3 tests/schema/test_schema_maskbench_sample.py --update"
    )


def test_no_invalid_instance_passes_where_the_grammar_claims_to_enforce(
    outcomes: dict[str, str],
) -> None:
    claimed = [key for key, outcome in outcomes.items() if outcome.endswith("claimed enforced")]
    assert not claimed, claimed


def main(arguments: list[str]) -> int:
    return report_and_update(run_sample(default_runner()), BASELINE, arguments)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
