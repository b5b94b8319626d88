"""A fixed sample of MaskBench (real-world schemas with valid and invalid instances) as a
correctness regression test: no valid instance refused, no invalid instance accepted where
the report claims the grammar enforces what makes it invalid, no crash. Timing lives in
``python -m bench.maskbench``, never here.

The data is ``../shared/maskbench-dev`` (see its SOURCE.md); the sample is every
``SAMPLE_STEP``-th file by sorted name, at most ``SAMPLE_SIZE`` of them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conformance_suite import PASS, Runner

MASKBENCH = Path(__file__).resolve().parents[3] / "shared" / "maskbench-dev"
SAMPLE_STEP = 50
SAMPLE_SIZE = 40


def sample_files() -> list[Path]:
    files = sorted(MASKBENCH.glob("*.json"))
    return files[::SAMPLE_STEP][:SAMPLE_SIZE]


FILES = sample_files()


@pytest.mark.skipif(
    not FILES,
    reason=f"{MASKBENCH} holds no MaskBench data files (only its SOURCE.md in this checkout)",
)
@pytest.mark.parametrize("path", FILES, ids=[path.stem for path in FILES])
def test_maskbench_file(path: Path, smollm2_vocab: Any, smollm2_tokenizer: Any) -> None:
    document = json.loads(path.read_text())
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
