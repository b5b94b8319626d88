"""Token bitmasks in the ecosystem's format: int32, shape ``(batch, ceil(vocab_size / 32))``.

Bit ``k`` of word ``w`` (little-endian bit order) is token ``32 * w + k``; a set bit allows
the token. The layout is XGrammar's and llguidance's, so masks can be handed to their
kernels and theirs to ours. Applying a mask works on numpy arrays and on torch tensors (CPU or
GPU); torch is used only when the caller passes a tensor, never imported by formline.
"""

from __future__ import annotations

import operator
import sys
from typing import Any

import numpy as np

from formline.native import apply_bitmask


def words_for(vocabulary_size: int) -> int:
    """Number of 32-bit words that hold one bit per token."""
    return (vocabulary_size + 31) // 32


def check_bitmask(
    shape: tuple[int, ...], is_int32: bool, dtype: Any, index: int, words: int
) -> None:
    """Raise ``ValueError`` unless a buffer of ``shape`` (``is_int32``: its ``dtype`` is
    int32) has a row ``index`` of at least ``words`` int32 words (wider rows are fine: a
    model's logits are often padded past its tokenizer's vocabulary). Costs about 0.3 µs
    (``dtype`` is printed only for the error: ``str()`` of a dtype alone costs 2.8 µs)."""
    if not is_int32:
        raise ValueError(f"the bitmask must be int32 (allocate_token_bitmask), not {dtype}")
    if len(shape) not in (1, 2):
        raise ValueError(f"the bitmask must have 1 or 2 dimensions, not shape {shape}")
    rows = shape[0] if len(shape) == 2 else 1
    if isinstance(index, bool) or not isinstance(index, int | np.integer) or not 0 <= index < rows:
        raise ValueError(f"row {index!r} is not one of the bitmask's {rows} rows")
    if shape[-1] < words:
        raise ValueError(
            f"the bitmask's rows have {shape[-1]} words; this vocabulary needs {words} "
            "(allocate_token_bitmask(batch, vocabulary_size) makes one)"
        )


def allocate_token_bitmask(batch_size: int, vocabulary_size: int) -> np.ndarray:
    """A ``(batch_size, ceil(vocabulary_size/32))`` int32 array with every token allowed.

    Raises:
        ValueError: a non-positive batch or vocabulary size.
    """
    if batch_size <= 0 or vocabulary_size <= 0:
        raise ValueError(
            f"batch_size and vocabulary_size must be positive, got {batch_size}, {vocabulary_size}"
        )
    return np.full((batch_size, words_for(vocabulary_size)), -1, dtype=np.int32)


def ids_to_bitmask(token_ids: np.ndarray, words: int) -> np.ndarray:
    """uint32 words with the bits of ``token_ids`` set.

    Raises:
        IndexError: an id at or past ``words * 32``.
    Costs O(words + len(token_ids)): a vocabulary's stop-token mask in 3 µs, where a flag
    per token packed into bits took 8.
    """
    ids = np.asarray(token_ids, dtype=np.int64)
    words_out = np.zeros(words, dtype=np.uint32)
    np.bitwise_or.at(words_out, ids >> 5, np.left_shift(np.uint32(1), (ids & 31).astype(np.uint32)))
    return words_out


def bitmask_to_ids(bitmask_row: Any, vocabulary_size: int | None = None) -> np.ndarray:
    """Allowed token ids of one bitmask row (numpy or torch). Costs O(words)."""
    row = _to_numpy(bitmask_row).astype("<i4", copy=False).view(np.uint8)
    flags = np.unpackbits(row, bitorder="little").astype(bool)
    if vocabulary_size is not None:
        flags = flags[:vocabulary_size]
    return np.nonzero(flags)[0]


def _to_numpy(array: Any) -> np.ndarray:
    if isinstance(array, np.ndarray):
        return array
    if hasattr(array, "detach"):
        return array.detach().cpu().numpy()
    return np.asarray(array)


# Minus infinity's bits per float type, as the unsigned integer of its width that the native
# kernel stores (it never reads a logit, so one kernel serves every float format).
NEGATIVE_INFINITY_BITS: dict[str, tuple[type[np.unsignedinteger[Any]], int]] = {
    "float16": (np.uint16, 0xFC00),
    "bfloat16": (np.uint16, 0xFF80),
    "float32": (np.uint32, 0xFF800000),
    "float64": (np.uint64, 0xFFF0000000000000),
}
_TORCH_INTEGER_OF_WIDTH = {2: "int16", 4: "int32", 8: "int64"}


def apply_token_bitmask_inplace(
    logits: Any, bitmask: Any, vocabulary_size: int | None = None, indices: list[int] | None = None
) -> None:
    """Set the logits of disallowed tokens to minus infinity, in place.

    ``logits`` is ``(vocab,)`` or ``(batch, vocab)``; ``bitmask`` is ``(words,)`` or
    ``(batch, words)``. Logits beyond the bitmask's coverage are disallowed; bitmask bits beyond
    the logits are ignored. ``indices`` selects the batch rows to mask (default: all); row ``i``
    of the logits takes row ``i`` of the bitmask (row 0 of a one-row bitmask), as in XGrammar.

    Contiguous float16, bfloat16, float32 or float64 logits in the machine's byte order (numpy,
    or a CPU torch tensor that needs no gradient) go through the native kernel
    (``native/apply.hpp``): one pass over the mask's words, 0.47-0.82 ms for 64 rows of 49k
    tokens (``python -m bench.apply_bench``; llguidance 0.42-0.47 ms in the same run). Other
    tensors (a GPU's, or one that needs a gradient) take a vectorised torch path on their
    device (on the CPU about 11 ms for those 64 rows); other numpy arrays,
    :func:`apply_token_bitmask_reference`.

    Raises:
        ValueError: logits or bitmask not 1- or 2-dimensional, their rows disagree (without
            ``indices``), a row of ``indices`` outside the logits or the bitmask, or a negative
            ``vocabulary_size``.
        TypeError: ``logits`` is neither a numpy array nor a torch tensor, or an index is not
            an integer.
    Costs O(selected rows x words) plus a store per refused token.
    """
    if isinstance(logits, np.ndarray):
        native = logits.dtype.name in NEGATIVE_INFINITY_BITS and logits.dtype.isnative
        if native and logits.flags.c_contiguous:
            _apply_native(logits, logits.dtype.name, _to_numpy(bitmask), vocabulary_size, indices)
        else:
            apply_token_bitmask_reference(logits, np.asarray(bitmask), vocabulary_size, indices)
        return
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(logits, torch.Tensor):
        raise TypeError(
            f"logits must be a numpy array or a torch tensor, got {type(logits).__name__}"
        )
    name = str(logits.dtype).removeprefix("torch.")
    if (
        logits.device.type == "cpu"
        and name in NEGATIVE_INFINITY_BITS
        and logits.is_contiguous()
        and not logits.requires_grad  # its in-place change must be in the graph: torch's ops
    ):
        integers = getattr(torch, _TORCH_INTEGER_OF_WIDTH[logits.element_size()])
        view = logits.view(integers).numpy()  # the same memory, as integers
        _apply_native(view, name, _to_numpy(bitmask), vocabulary_size, indices)
        # Written behind torch's back: its version goes up as with torch's in-place ops, so a
        # backward() that saved these logits refuses instead of computing wrong gradients.
        torch.autograd.graph.increment_version(logits)
        return
    _apply_torch(torch, logits, bitmask, vocabulary_size, indices)


def _apply_native(
    logits: np.ndarray,
    float_name: str,
    bitmask: np.ndarray,
    vocabulary_size: int | None,
    indices: list[int] | None,
) -> None:
    """The native kernel on a C-contiguous array holding ``float_name`` values."""
    kind, negative_infinity = NEGATIVE_INFINITY_BITS[float_name]
    logits_2d, mask_2d, selected, width = _checked(logits, bitmask, vocabulary_size, indices)
    rows = np.array(selected, dtype=np.int64)
    mask_rows = rows if mask_2d.shape[0] > 1 else np.zeros_like(rows)
    words = np.ascontiguousarray(mask_2d)
    if words.dtype != np.uint32:
        words = words.astype(np.int32, copy=False).view(np.uint32)
    apply_bitmask(logits_2d.view(kind), words, rows, mask_rows, width, negative_infinity)


def _checked(
    logits: Any, bitmask: Any, vocabulary_size: int | None, indices: Any
) -> tuple[Any, Any, list[int], int]:
    """Logits and bitmask as 2-D, the selected rows and the width the bitmask may allow: one
    check for the native, reference and torch paths, so that they refuse alike.

    Raises:
        ValueError, TypeError: see :func:`apply_token_bitmask_inplace`.
    """
    if logits.ndim not in (1, 2) or bitmask.ndim not in (1, 2):
        raise ValueError(
            f"logits and bitmask must have 1 or 2 dimensions, not shapes "
            f"{tuple(logits.shape)} and {tuple(bitmask.shape)}"
        )
    logits_2d = logits.reshape(1, -1) if logits.ndim == 1 else logits
    mask_2d = bitmask.reshape(1, -1) if bitmask.ndim == 1 else bitmask
    count, mask_rows = logits_2d.shape[0], mask_2d.shape[0]
    if indices is None:
        if mask_rows != count:
            raise ValueError(f"logits have {count} rows but the bitmask has {mask_rows}")
        rows = list(range(count))
    else:
        rows = [operator.index(row) for row in indices]
    for row in rows:
        if not 0 <= row < count:
            raise ValueError(f"row {row} is outside the logits' {count} rows")
        if mask_rows > 1 and row >= mask_rows:
            raise ValueError(f"row {row} is outside the bitmask's {mask_rows} rows")
    if vocabulary_size is not None and vocabulary_size < 0:
        raise ValueError(f"vocabulary_size must not be negative, got {vocabulary_size}")
    vocab = logits_2d.shape[1]
    width = vocab if vocabulary_size is None else min(vocabulary_size, vocab)
    return logits_2d, mask_2d, rows, width


def apply_token_bitmask_reference(
    logits: np.ndarray, bitmask: np.ndarray, vocabulary_size: int | None, indices: list[int] | None
) -> None:
    """:func:`apply_token_bitmask_inplace` on numpy, bit by bit (the differential tests' oracle,
    and the path for float arrays the kernel does not take: strided, or in the other byte
    order). Costs four passes and two temporaries per row (about 20 µs a row of 49k tokens).

    Raises:
        ValueError, TypeError: see :func:`apply_token_bitmask_inplace`.
    """
    logits_2d, mask_2d, rows, width = _checked(logits, bitmask, vocabulary_size, indices)
    for row in rows:
        mask_row = mask_2d[row if mask_2d.shape[0] > 1 else 0]
        flags = np.unpackbits(mask_row.astype("<i4", copy=False).view(np.uint8), bitorder="little")
        allowed = np.zeros(logits_2d.shape[1], dtype=bool)
        covered = min(width, flags.shape[0])
        allowed[:covered] = flags[:covered].astype(bool)
        logits_2d[row, ~allowed] = -np.inf


def _apply_torch(
    torch: Any, logits: Any, bitmask: Any, vocabulary_size: int | None, indices: list[int] | None
) -> None:
    """All selected rows at once, on the logits' device (a vLLM batch masks tens of rows per
    step), with torch's in-place ops (autograd sees them)."""
    if isinstance(bitmask, np.ndarray):
        bitmask = torch.from_numpy(np.ascontiguousarray(bitmask))
    logits_2d, mask_2d, rows, width = _checked(logits, bitmask, vocabulary_size, indices)
    if not rows:
        return
    vocab = logits_2d.shape[1]
    select = torch.tensor(rows, device=logits.device, dtype=torch.long)
    if mask_2d.shape[0] > 1:
        # Only the selected rows go to the logits' device: vLLM's bitmask has a row per
        # batch slot (up to 256 rows of Llama-3's 4,008 words: 4 MiB a step), most of them
        # unconstrained.
        taken = torch.tensor(rows, device=mask_2d.device, dtype=torch.long)
        words = mask_2d[taken].to(logits.device)
    else:
        words = mask_2d.to(logits.device).expand(len(rows), -1)
    shifts = torch.arange(32, device=logits.device, dtype=torch.int32)
    flags = ((words.to(torch.int32).unsqueeze(-1) >> shifts) & 1).reshape(len(rows), -1)
    allowed = torch.zeros((len(rows), vocab), dtype=torch.bool, device=logits.device)
    covered = min(width, flags.shape[1])
    allowed[:, :covered] = flags[:, :covered].bool()
    masked = logits_2d[select].masked_fill_(~allowed, float("-inf"))
    logits_2d[select] = masked
