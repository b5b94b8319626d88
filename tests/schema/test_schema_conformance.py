"""The official JSON-Schema-Test-Suite as a ratchet (see conformance_suite.py).

Every test's outcome must equal the committed baseline: a regression fails, and so does an
improvement until the baseline is updated (``python3 tests/schema/conformance_suite.py
--update``), so the baseline always says exactly what formline passes.
"""

from __future__ import annotations

from typing import Any

import pytest
from conformance_suite import (
    BASELINE,
    PASS,
    SUITE,
    Runner,
    compare_with_baseline,
    run_suite,
    summary,
)

from formline.vocab import Vocabulary


@pytest.fixture(scope="module")
def outcomes(smollm2_vocab: Vocabulary, smollm2_tokenizer: Any, tmp_path_factory: Any) -> Any:
    assert SUITE.is_dir(), f"the official suite is missing at {SUITE}"
    runner = Runner(smollm2_vocab, smollm2_tokenizer, tmp_path_factory.mktemp("cache"))
    return run_suite(runner)


def test_outcomes_match_the_baseline(outcomes: dict[str, str]) -> None:
    compare_with_baseline(outcomes, BASELINE, "python3 tests/schema/conformance_suite.py --update")


def test_no_valid_instance_is_refused(
    outcomes: dict[str, str],
) -> None:
    counts = summary(outcomes)
    refused = [key for key, outcome in outcomes.items() if outcome == "valid refused"]
    # The gap this test once allowed (enum [[0]] refused [0.0]: a nested number was not
    # re-spelled) is closed: every number of a literal is written in each equal spelling.
    assert not refused, refused
    assert counts["invalid accepted, keyword claimed enforced"] == 0
    assert counts[PASS] >= 2900
