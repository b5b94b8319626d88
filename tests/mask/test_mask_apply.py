"""The native bitmask apply (``native/apply.hpp``) against the numpy reference, bit for bit:
random masks, rows, widths and float types, numpy and torch, contiguous or not."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from formline.mask.bitmask import apply_token_bitmask_inplace, apply_token_bitmask_reference
from formline.native import apply_bitmask

NUMPY_TYPES = ("float16", "float32", "float64")
TORCH_TYPES = ("float16", "bfloat16", "float32", "float64")


@st.composite
def cases(draw: Any) -> dict[str, Any]:
    rows = draw(st.integers(1, 4))
    vocab = draw(st.integers(1, 200))
    words = draw(st.integers(0, (vocab + 31) // 32 + 2))  # short, exact or wide rows
    mask_rows = draw(st.sampled_from([1, rows, rows + 2]))
    # Words biased to all-ones and all-zeros (the kernel's fast paths) and mixed bits.
    word = st.one_of(st.just(-1), st.just(0), st.integers(-(2**31), 2**31 - 1))
    bitmask = np.array(
        draw(st.lists(word, min_size=mask_rows * words, max_size=mask_rows * words)),
        dtype=np.int32,
    ).reshape(mask_rows, words)
    vocabulary_size = draw(st.one_of(st.none(), st.integers(0, vocab + 40)))
    chosen = draw(st.lists(st.integers(0, rows - 1), unique=True, max_size=rows))
    indices = None if mask_rows == rows and draw(st.booleans()) else chosen
    if mask_rows == rows == 1 and indices == []:
        indices = None
    return {
        "shape": (rows, vocab),
        "bitmask": bitmask,
        "vocabulary_size": vocabulary_size,
        "indices": indices,
        "seed": draw(st.integers(0, 2**16)),
    }


def refused_by_reference(case: dict[str, Any]) -> np.ndarray:
    """Which logits the reference sets to minus infinity."""
    zeros = np.zeros(case["shape"], dtype=np.float64)
    apply_token_bitmask_reference(zeros, case["bitmask"], case["vocabulary_size"], case["indices"])
    return np.isneginf(zeros)


def check(result: np.ndarray, original: np.ndarray, refused: np.ndarray) -> None:
    assert np.isneginf(result[refused]).all()
    assert np.array_equal(result[~refused], original[~refused])


@settings(max_examples=300, deadline=None)
@given(case=cases(), float_name=st.sampled_from(NUMPY_TYPES))
def test_numpy_apply_equals_the_reference(case: dict[str, Any], float_name: str) -> None:
    original = np.random.default_rng(case["seed"]).normal(size=case["shape"]).astype(float_name)
    logits = original.copy()
    apply_token_bitmask_inplace(logits, case["bitmask"], case["vocabulary_size"], case["indices"])
    check(logits, original, refused_by_reference(case))


@settings(max_examples=200, deadline=None)
@given(case=cases(), float_name=st.sampled_from(TORCH_TYPES), contiguous=st.booleans())
def test_torch_apply_equals_the_reference(
    case: dict[str, Any], float_name: str, contiguous: bool
) -> None:
    torch = pytest.importorskip("torch", reason="needs torch: pip install torch==2.13.0")
    rows, vocab = case["shape"]
    values = np.random.default_rng(case["seed"]).normal(size=(rows, vocab))
    dtype = getattr(torch, float_name)
    if contiguous:
        logits = torch.from_numpy(values).to(dtype)
    else:  # a strided view: the vectorised torch path, which must agree too
        logits = torch.from_numpy(np.repeat(values, 2, axis=1)).to(dtype)[:, ::2]
    original = logits.double().numpy().copy()
    mask = torch.from_numpy(case["bitmask"])
    apply_token_bitmask_inplace(logits, mask, case["vocabulary_size"], case["indices"])
    check(logits.double().numpy(), original, refused_by_reference(case))


def test_a_strided_numpy_row_takes_the_reference_path() -> None:
    bitmask = np.array([[0b1010]], dtype=np.int32)
    wide = np.zeros((1, 8), dtype=np.float32)
    apply_token_bitmask_inplace(wide[:, ::2], bitmask)
    # Elements 0, 2, 4, 6 are tokens 0-3; mask 0b1010 refuses tokens 0 and 2.
    assert np.isfinite(wide[0]).tolist() == [False, True, True, True, False, True, True, True]


def test_a_one_dimensional_row_and_logits_past_the_bitmask() -> None:
    logits = np.zeros(70, dtype=np.float32)
    apply_token_bitmask_inplace(logits, np.array([-1, 1], dtype=np.int32))
    assert np.isfinite(logits).nonzero()[0].tolist() == [*range(32), 32]


def test_rows_out_of_range_are_named() -> None:
    logits = np.zeros((2, 40), dtype=np.float32)
    bitmask = np.full((2, 2), -1, dtype=np.int32)
    with pytest.raises(ValueError, match="row 5 is outside the logits' 2 rows"):
        apply_token_bitmask_inplace(logits, bitmask, indices=[5])
    with pytest.raises(ValueError, match="logits have 2 rows but the bitmask has 1"):
        apply_token_bitmask_inplace(logits, bitmask[:1])
    rows = np.array([0], dtype=np.int64)
    with pytest.raises(ValueError, match="row 3 is outside the bitmask's 2 rows"):
        apply_bitmask(  # the kernel's own check
            logits.view(np.uint32), bitmask.view(np.uint32), rows, rows + 3, 40, 0xFF800000
        )


@pytest.mark.parametrize("path", ["native", "reference", "torch"])
def test_every_path_refuses_bad_arguments_alike(path: str) -> None:
    """The native, reference and torch paths share one check: the same error for the same
    mistake (before, the reference wrapped a negative row and sliced a negative width)."""

    def apply(logits: np.ndarray, bitmask: np.ndarray, **options: Any) -> None:
        if path == "reference":
            apply_token_bitmask_reference(
                logits, bitmask, options.get("vocabulary_size"), options.get("indices")
            )
        elif path == "torch":
            torch = pytest.importorskip("torch", reason="needs torch: pip install torch==2.13.0")
            strided = torch.from_numpy(np.repeat(logits, 2, axis=-1))[..., ::2]
            apply_token_bitmask_inplace(strided, torch.from_numpy(bitmask), **options)
        else:
            apply_token_bitmask_inplace(logits, bitmask, **options)

    logits = np.zeros((2, 40), dtype=np.float32)
    bitmask = np.full((2, 2), -1, dtype=np.int32)
    with pytest.raises(ValueError, match="row -1 is outside the logits' 2 rows"):
        apply(logits, bitmask, indices=[-1])
    with pytest.raises(ValueError, match="row 2 is outside the logits' 2 rows"):
        apply(logits, bitmask, indices=[2])
    with pytest.raises(ValueError, match="row 2 is outside the bitmask's 2 rows"):
        apply(np.zeros((3, 40), dtype=np.float32), bitmask, indices=[2])
    with pytest.raises(TypeError):
        apply(logits, bitmask, indices=[1.7])
    with pytest.raises(ValueError, match="vocabulary_size must not be negative"):
        apply(logits, bitmask, vocabulary_size=-5)
    with pytest.raises(ValueError, match="1 or 2 dimensions"):
        apply(np.zeros((2, 2, 40), dtype=np.float32), bitmask)


def test_big_endian_logits_get_minus_infinity() -> None:
    logits = np.zeros((1, 40), dtype=">f4")
    apply_token_bitmask_inplace(logits, np.array([[1, 0]], dtype=np.int32))
    assert np.isneginf(logits[0, 1:]).all() and logits[0, 0] == 0


def test_a_tensor_autograd_tracks_is_masked_by_torch_ops() -> None:
    """Writing behind autograd's back would give wrong gradients silently: a tensor that
    needs a gradient is masked with torch's in-place ops, and one written natively has its
    version bumped, so backward() refuses instead."""
    torch = pytest.importorskip("torch", reason="needs torch: pip install torch==2.13.0")
    weights = torch.ones(1, 40, requires_grad=True)
    scores = weights.exp()  # exp saves its output for the gradient
    apply_token_bitmask_inplace(scores, torch.tensor([[1, 0]], dtype=torch.int32))
    assert torch.isneginf(scores[0, 1:]).all()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        scores.sum().backward()
    saved = torch.zeros(1, 40)  # needs no gradient (the native kernel) but is saved by mul
    product = (weights * saved).sum()
    apply_token_bitmask_inplace(saved, torch.tensor([1, 0], dtype=torch.int32))
    assert torch.isneginf(saved[0, 1:]).all() and saved[0, 0] == 0
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        product.backward()
