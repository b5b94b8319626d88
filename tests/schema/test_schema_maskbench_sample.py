"""A fixed sample of MaskBench (real-world schemas with valid and invalid instances) as a
correctness regression test: no valid instance refused, no invalid instance accepted where
the report claims the grammar enforces what makes it invalid, no crash. Timing lives in
``python -m bench.maskbench``, never here.

The data is the repository's MaskBench sample, ``tests/data/maskbench/`` (300 files,
stratified over the subsets; see its SOURCE.md); this test walks every ``SAMPLE_STEP``-th
file of it by sorted name. All 300 passed when the sample was taken.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conformance_suite import PASS, Runner

MASKBENCH = Path(__file__).resolve().parents[1] / "data" / "maskbench"
SAMPLE_STEP = 6  # 50 of the 300 files: about a minute on 2 cores (all 300: about 5)


def sample_files() -> list[Path]:
    return sorted(MASKBENCH.glob("*.json"))[::SAMPLE_STEP]


FILES = sample_files()


def test_the_sample_is_in_the_repository() -> None:
    assert len(sorted(MASKBENCH.glob("*.json"))) >= 250, f"the MaskBench sample at {MASKBENCH}"


@pytest.mark.parametrize("path", FILES, ids=[path.stem for path in FILES])
def test_maskbench_file(path: Path, smollm2_vocab: Any, smollm2_tokenizer: Any) -> None:
    document = json.loads(path.read_text(encoding="utf-8"))
    runner = Runner(smollm2_vocab, smollm2_tokenizer)
    outcomes = runner.run_group("draft2020-12", document)
    failures = [
        (test.get("description", ""), outcome)
        for test, outcome in zip(document["tests"], outcomes, strict=True)
        if outcome != PASS
        and not outcome.startswith("not compiled")
        and outcome != "invalid accepted, keyword reported ignored"
    ]
    assert not failures, failures
