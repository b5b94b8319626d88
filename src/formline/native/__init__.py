"""The compiled kernels: the mask kernel (C++ in ``kernel.hpp``, bound by Cython in ``_kernel.pyx``)
and the automata's partition refinement; used by :mod:`formline.automata` and
:mod:`formline.mask`, importing neither.

Built by the package's install (``pip install -e .`` compiles it in place); there is no pure
Python fallback for the mask: :mod:`formline.mask.reference` is the slow oracle the
differential tests compare the kernel with.
"""

from formline.native._kernel import (
    NativeMaskKernel,
    NativeTokenTable,
    build_pushdown,
    copy_mask,
    copy_masks,
    determinize,
    flatten_rules,
    refine_partition,
    rule_references,
    trim_states,
)

__all__ = [
    "NativeMaskKernel",
    "NativeTokenTable",
    "build_pushdown",
    "copy_mask",
    "copy_masks",
    "determinize",
    "flatten_rules",
    "refine_partition",
    "rule_references",
    "trim_states",
]
