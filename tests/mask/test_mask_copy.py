"""The batch's native row copy (``native.copy_masks``) against numpy: masks of any width into
any rows of a bitmask, words past a mask zeroed, on one thread or shared with the batch's
helpers (held or not), a row out of range refused."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from formline.native import copy_masks, prepare_helpers, release_helpers


@st.composite
def cases(draw: Any) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, int, bool]:
    rows = draw(st.integers(1, 20))  # the threads take 4 rows at a time
    columns = draw(st.integers(0, 70))
    count = draw(st.integers(0, rows))
    targets = np.array(draw(st.permutations(range(rows)))[:count], dtype=np.int64)
    sources = []
    for _ in range(count):
        width = draw(st.integers(0, columns + 3))  # shorter, as wide or wider than a row
        words = draw(st.lists(st.integers(0, 2**32 - 1), min_size=width, max_size=width))
        sources.append(np.array(words, dtype=np.uint32))
    bitmask = np.full((rows, columns), -7, dtype=np.int32)
    return sources, targets, bitmask, draw(st.integers(1, 3)), draw(st.booleans())


@settings(max_examples=200, deadline=None)
@given(cases())
def test_copy_masks_equals_numpy(
    case: tuple[list[np.ndarray], np.ndarray, np.ndarray, int, bool],
) -> None:
    sources, rows, bitmask, threads, is_held = case
    expected = bitmask.copy()
    for source, row in zip(sources, rows, strict=True):
        width = min(len(source), bitmask.shape[1])
        expected[row] = 0
        expected[row, :width] = source[:width].view(np.int32)
    if is_held:
        prepare_helpers(threads)
    try:
        copy_masks(sources, bitmask, rows, threads)
    finally:
        if is_held:
            release_helpers(threads)
    np.testing.assert_array_equal(bitmask, expected)


def test_copy_masks_refuses_a_row_outside_the_bitmask() -> None:
    bitmask = np.zeros((2, 4), dtype=np.int32)
    with pytest.raises(ValueError, match="outside"):
        copy_masks([np.ones(4, dtype=np.uint32)], bitmask, np.array([2], dtype=np.int64))
    with pytest.raises(ValueError, match="1 masks but 2 rows"):
        copy_masks([np.ones(4, dtype=np.uint32)], bitmask, np.array([0, 1], dtype=np.int64))
    assert not bitmask.any()  # nothing written before the checks passed
