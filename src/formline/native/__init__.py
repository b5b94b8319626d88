"""The compiled kernels, C++ bound by Cython in ``_kernel.pyx``: the mask kernel and the
parser's token step (``kernel.hpp``), the matcher's per-token calls (``matcher_core.pxi``),
the lazy automaton (``automaton.hpp``) and its build from the flattened IR (``thompson.hpp``,
``lazy_build.hpp``), and the automata routines of the reference path (``dfa.hpp``); used by
:mod:`formline.grammar`, :mod:`formline.automata`, :mod:`formline.parser` and
:mod:`formline.mask`, importing none of formline.

Built by the package's install (``pip install -e .`` compiles it in place); there is no pure
Python fallback: :mod:`formline.mask.reference`, ``build_pushdown_reference`` and
``tests/grammar/flatten_reference.py`` are the slow oracles the differential tests compare the
kernel with.
"""

from formline.native._kernel import (
    STACK_LIMIT_EXCEEDED,
    STATE_LIMIT_EXCEEDED,
    MatcherCore,
    NativeAutomaton,
    NativeMaskKernel,
    NativeTokenTable,
    apply_bitmask,
    build_automaton,
    copy_mask,
    copy_mask_row,
    copy_masks,
    determinize,
    fill_masks,
    flatten_rules,
    helper_threads,
    prepare_helpers,
    recursive_rule_indices,
    refine_partition,
    release_helpers,
    spin_mutex_count,
    trim_states,
)

__all__ = [
    "STACK_LIMIT_EXCEEDED",
    "STATE_LIMIT_EXCEEDED",
    "MatcherCore",
    "NativeAutomaton",
    "NativeMaskKernel",
    "NativeTokenTable",
    "apply_bitmask",
    "build_automaton",
    "copy_mask",
    "copy_mask_row",
    "copy_masks",
    "determinize",
    "fill_masks",
    "flatten_rules",
    "helper_threads",
    "prepare_helpers",
    "recursive_rule_indices",
    "refine_partition",
    "release_helpers",
    "spin_mutex_count",
    "trim_states",
]
