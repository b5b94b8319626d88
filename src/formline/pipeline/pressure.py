"""Constraint pressure per field: where the mask overrode what the model wanted to write.

While decoding, each sampled step records the probability mass the mask removed and whether
the model's preferred token was refused (:class:`PressureListener`, a listener on the loop).
Here those steps are attributed to JSON paths (``age``, ``items[2].unit_price``) by
scanning the output text, and aggregated per path. A field written under heavy pressure is
one the model wanted to write differently (seed 000: the model wanted ``"age": "21"`` and
was forced onto a digit): a reason to doubt its content, not its form.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from formline.pipeline.listeners import StepListener

DEFAULT_THRESHOLD = 0.5  # flag a field when the mask removed over half the model's mass


@dataclass
class PressureListener(StepListener):
    """Measures each constrained step: the probability mass (softmax of the raw logits) on
    tokens the mask removed, whether the model's own top token was one of them, and that
    token; ``steps`` maps output positions to ``(removed, refused, preferred)``. Forced and
    closing tokens have no entry. Costs two exponentials over the vocabulary per step (about
    0.1 ms for 49,152 logits) in one scratch buffer."""

    steps: dict[int, tuple[float, bool, int]] = field(default_factory=dict)
    # Per sampled position: the chosen token's probability under the unmasked distribution
    # (how sure the model itself was of what was written: the per-field confidence).
    chosen: dict[int, float] = field(default_factory=dict)
    _scratch: np.ndarray | None = None
    _masked: np.ndarray | None = None
    _before: tuple[int, Any, float] = (0, 0.0, 1.0)

    def on_logits(
        self, position: int, logits: np.ndarray, matcher: Any, forward_seconds: float
    ) -> None:
        if matcher is None:
            return
        preferred = int(np.argmax(logits))
        peak = logits[preferred]
        self._before = (preferred, peak, self._exp_sum(logits, peak))

    def on_masked(self, position: int, logits: np.ndarray, bitmask_row: np.ndarray) -> None:
        preferred, peak, total = self._before
        kept = self._exp_sum(logits, peak)  # exp(-inf) is 0: removed tokens drop out
        refused = not bool(np.isfinite(logits[preferred]))
        self.steps[position] = (max(0.0, 1.0 - kept / total), refused, preferred)
        self._masked = logits

    def on_token(self, position: int, token: int, matcher: Any) -> None:
        if matcher is None or self._masked is None or position not in self.steps:
            return
        _, peak, total = self._before
        # An allowed token's masked logit is its raw one: its share of the raw softmax.
        self.chosen[position] = float(np.exp(self._masked[token] - peak) / total)
        self._masked = None

    def _exp_sum(self, logits: np.ndarray, peak: Any) -> float:
        scratch = self._scratch
        if scratch is None or scratch.shape != logits.shape or scratch.dtype != logits.dtype:
            scratch = self._scratch = np.empty_like(logits)
        np.subtract(logits, peak, out=scratch)
        np.exp(scratch, out=scratch)
        return float(scratch.sum())


@dataclass
class FieldPressure:
    """The pressure on one JSON path."""

    path: str
    steps: int = 0
    max_removed: float = 0.0
    total_removed: float = 0.0
    preferred_refused: int = 0
    # The same maximum over the steps where the model preferred content (a token with a
    # letter or digit), not punctuation or spacing: on extraction-dev most removed mass
    # was the model asking for '{"' or '",' again, not for another value.
    content_max_removed: float = 0.0
    # Over the sampled content tokens (a letter or digit) of the path: the lowest and the
    # summed log of the chosen token's unmasked probability (1.0 and 0.0 when every content
    # token was forced: the grammar, not the model, wrote it; the lowest is 0.0 when the
    # budget's closing policy wrote content there: a placeholder, not an answer).
    min_probability: float = 1.0
    log_probability: float = 0.0
    content_steps: int = 0

    @property
    def confidence(self) -> float:
        """How sure the model was of this path's value: the unmasked probability of its
        least likely sampled content token (1.0 when none was sampled, 0.0 when the budget
        wrote content there)."""
        return self.min_probability

    @property
    def mean_removed(self) -> float:
        return self.total_removed / self.steps if self.steps else 0.0

    def is_flagged(self, threshold: float = DEFAULT_THRESHOLD) -> bool:
        """Whether the model was pushed off its preference hard on this field."""
        return self.max_removed >= threshold


def byte_paths(text: bytes) -> list[str]:
    """The JSON path each byte of ``text`` belongs to (``""`` for the top level).

    A key's bytes belong to its member's path; punctuation to the enclosing container.
    Tolerates truncated text. Costs O(len(text) x depth).
    """
    scanner = _PathScanner()
    for index, byte in enumerate(text):
        scanner.feed(index, byte)
    return scanner.paths


class _PathScanner:
    def __init__(self) -> None:
        self.paths: list[str] = []
        self.frames: list[list[object]] = []  # [kind "o"/"a", key or index, expects key?]
        self.in_string = self.escaped = self.in_key = False
        self.key_start = 0
        self.key = bytearray()

    def path(self) -> str:
        parts = []
        for kind, label, _ in self.frames:
            if kind == "a":
                parts.append(f"[{label}]")
            elif label is not None:
                parts.append(f".{label}" if parts else str(label))
        return "".join(parts)

    def feed(self, index: int, byte: int) -> None:
        if self.in_string:
            self.paths.append(self.path())
            self._string_byte(index, byte)
            return
        character = chr(byte)
        if character in "}]" and self.frames:
            self.frames.pop()
        self.paths.append(self.path())
        if character == "{":
            self.frames.append(["o", None, True])
        elif character == "[":
            self.frames.append(["a", 0, False])
        elif character == "," and self.frames:
            top = self.frames[-1]
            if top[0] == "a":
                top[1] = int(str(top[1])) + 1
            else:
                top[1], top[2] = None, True
        elif character == '"':
            self.in_string = True
            self.in_key = (
                bool(self.frames) and self.frames[-1][0] == "o" and bool(self.frames[-1][2])
            )
            self.key_start, self.key = index, bytearray()

    def _string_byte(self, index: int, byte: int) -> None:
        if self.escaped:
            self.escaped = False
        elif byte == 0x5C:
            self.escaped = True
        elif byte == 0x22:
            self.in_string = False
            if self.in_key:
                top = self.frames[-1]
                top[1], top[2] = self.key.decode("utf-8", "replace"), False
                member = self.path()
                for position in range(self.key_start, index + 1):
                    self.paths[position] = member
            return
        if self.in_key:
            self.key.append(byte)


def field_pressure(
    token_ids: Sequence[int],
    token_bytes: Sequence[bytes],
    step_pressure: dict[int, tuple[float, bool, int]],
    confidence: dict[int, float] | None = None,
    answer_from: int = 0,
    closing_tokens: int = 0,
) -> dict[str, FieldPressure]:
    """Aggregate per-step pressure onto the JSON paths the steps' tokens wrote.

    A token is attributed to the path of its first byte that is not JSON punctuation (its
    first byte otherwise). ``answer_from``: the bytes of free rationale before the JSON
    (``think=N``); tokens wholly inside it are left out. ``closing_tokens``: the last tokens,
    written by the budget's closing policy (``Generation.closing_tokens``); a path they
    write content to gets probability 0, as the model never chose it. Costs O(output bytes).
    """
    pieces = [token_bytes[token] if 0 <= token < len(token_bytes) else b"" for token in token_ids]
    text = b"".join(pieces)
    paths = [""] * answer_from + byte_paths(text[answer_from:])
    result: dict[str, FieldPressure] = {}
    closing_from, offset = len(pieces) - closing_tokens, 0
    for position, piece in enumerate(pieces):
        start, offset = offset, offset + len(piece)
        # The closing text's values: on extraction-dev, 11 the budget wrote ("total": 1,
        # "notice_days": 3) counted as sure (1.0, no sampled step); 8 of them were wrong.
        is_closing = position >= closing_from and _is_content(piece)
        if not piece or offset <= answer_from or not (is_closing or position in step_pressure):
            continue
        path = _path_of(text, paths, max(start, answer_from), offset)
        entry = result.setdefault(path, FieldPressure(path))
        if is_closing:
            entry.min_probability = 0.0
            continue
        removed, refused, preferred = step_pressure[position]
        entry.steps += 1
        entry.max_removed = max(entry.max_removed, removed)
        entry.total_removed += removed
        entry.preferred_refused += int(refused)
        if 0 <= preferred < len(token_bytes) and _is_content(token_bytes[preferred]):
            entry.content_max_removed = max(entry.content_max_removed, removed)
        if confidence is not None and position in confidence and _is_content(piece):
            probability = max(confidence[position], 1e-30)
            entry.min_probability = min(entry.min_probability, probability)
            entry.log_probability += float(np.log(probability))
            entry.content_steps += 1
    return result


def _path_of(text: bytes, paths: list[str], start: int, end: int) -> str:
    """The path of a token's bytes ``text[start:end]``: that of its first byte that is not
    JSON punctuation (its first byte otherwise)."""
    chosen = next((at for at in range(start, end) if chr(text[at]) not in '{}[],:" \n'), start)
    return paths[chosen] if chosen < len(paths) else ""


def _is_content(piece: bytes) -> bool:
    """A token that carries a value: a letter or digit (or any non-ASCII byte)."""
    return any(byte >= 0x80 or chr(byte).isalnum() for byte in piece)


def top_level(pressure: dict[str, FieldPressure]) -> dict[str, FieldPressure]:
    """Roll paths up to their top-level field (``items[2].unit_price`` -> ``items``)."""
    rolled: dict[str, FieldPressure] = {}
    for path, entry in pressure.items():
        name = path.split(".")[0].split("[")[0]
        target = rolled.setdefault(name, FieldPressure(name))
        target.steps += entry.steps
        target.max_removed = max(target.max_removed, entry.max_removed)
        target.total_removed += entry.total_removed
        target.preferred_refused += entry.preferred_refused
        target.content_max_removed = max(target.content_max_removed, entry.content_max_removed)
        target.min_probability = min(target.min_probability, entry.min_probability)
        target.log_probability += entry.log_probability
        target.content_steps += entry.content_steps
    return rolled
