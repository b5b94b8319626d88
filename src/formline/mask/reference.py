"""Reference (slow, obviously correct) mask: every token walked through the parser.

Used by the differential tests and for debugging a suspicious mask: it shares the parser
with the fast path but none of the precomputation (token index, inside masks, escape
groups, caches). Costs O(vocabulary x token bytes) per call: about a second for 150k tokens.
"""

from __future__ import annotations

import numpy as np

from formline.mask.matcher import GrammarMatcher


def brute_force_allowed_ids(matcher: GrammarMatcher) -> np.ndarray:
    """Token ids that ``matcher.accept_token`` would accept now (the state is unchanged)."""
    if matcher.is_terminated():
        return np.array(sorted(matcher.compiled.vocabulary.eos_ids), dtype=np.int64)
    automaton = matcher.compiled.automaton
    vocabulary = matcher.compiled.vocabulary
    stacks = matcher._stacks
    allowed = []
    for token_id, data in enumerate(vocabulary.token_bytes):
        if token_id in vocabulary.eos_ids:
            if matcher.can_end():
                allowed.append(token_id)
            continue
        if token_id in vocabulary.special_ids or not data:
            continue
        if automaton.advance(stacks, data) is not None:
            allowed.append(token_id)
    return np.array(allowed, dtype=np.int64)
