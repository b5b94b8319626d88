"""What watches the decoding loop (:mod:`.decoding`) without being a copy of it.

A :class:`StepListener` sees every sampled step: the raw logits, the masked logits, the
token chosen, and the output as it grows; :meth:`StepListener.on_output` may stop the loop
by returning a finish reason. The constraint's pressure (:mod:`.pressure`), the trace
recorder (:mod:`formline.trace.recorder`), streaming (:class:`TokenFeed`) and a deadline
(:class:`Deadline`) are listeners.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from formline.mask.matcher import GrammarMatcher


class StepListener:
    """Hooks on the decoding loop; each does nothing unless overridden. A hook costs one
    Python call per step."""

    def on_start(self, prompt_tokens: int) -> None:
        """The prompt (``prompt_tokens`` long) fits the context: decoding begins, before
        the prompt's pass. Not called for a prompt refused for its length, nor for a loop
        already past its deadline (it ends as a timeout before its prompt's pass)."""

    def on_logits(
        self,
        position: int,
        logits: np.ndarray,
        matcher: GrammarMatcher | None,
        forward_seconds: float,
    ) -> None:
        """The raw logits of output position ``position`` (before the mask; read only), and
        the seconds the forward pass that made them took."""

    def on_masked(self, position: int, logits: np.ndarray, bitmask_row: np.ndarray) -> None:
        """The same logits once masked (constrained loops only; read only)."""

    def on_token(self, position: int, token: int, matcher: GrammarMatcher | None) -> None:
        """The token chosen at ``position``, before the matcher accepts it."""

    def on_output(self, output: list[int]) -> str | None:
        """The output so far, after each step and once at the end; a finish reason
        (``"timeout"``, ``"cancelled"``) stops the loop."""
        return None

    def max_tokens(self) -> int | None:
        """A lower output budget this listener holds the loop to from now (read after each
        accepted token; ``None``: the loop's own). The loop's closing policy then closes
        the grammar within it (a ``formline_think`` answer keeps ``max_tokens`` to itself
        once its rationale ends early)."""
        return None


class TokenFeed(StepListener):
    """Hands the tokens added since the last step to ``callback`` (streaming); a callback
    that returns ``False`` stops the loop with finish reason ``"cancelled"`` (a client that
    went away)."""

    def __init__(self, callback: Callable[[list[int]], bool | None]):
        self.callback = callback
        self.reported = 0

    def on_output(self, output: list[int]) -> str | None:
        if len(output) <= self.reported:
            return None
        fresh = output[self.reported :]
        self.reported = len(output)
        return "cancelled" if self.callback(fresh) is False else None


class Deadline(StepListener):
    """Stops the loop at the first step past ``deadline`` (a ``time.monotonic()`` value)
    with finish reason ``"timeout"``. Costs a clock read per step."""

    def __init__(self, deadline: float):
        self.deadline = deadline

    def on_output(self, output: list[int]) -> str | None:
        return "timeout" if time.monotonic() > self.deadline else None
