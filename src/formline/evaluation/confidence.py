"""Which per-field signal predicts a wrong field: AUROC of each over a variant's records.

Every sampled step records the chosen token's probability under the model's unmasked
distribution and the mass the mask removed (:mod:`formline.pipeline.pressure`). Per scored
field (and everything under it: ``items[2].price`` counts for ``items``) the signals are,
each oriented so that higher means "more likely right":

- ``min_probability``: the least likely content token the model chose there;
- ``mean_log_probability``: the mean log-probability of its content tokens;
- ``pressure``: one minus the most probability mass the mask removed there (the old flag);
- ``grounded``: the share of the field's string and number leaves found in the task's text
  (:func:`formline.pipeline.grounding.grounded_share`; 0.5 for a field with none);
- ``confidence``: ``Result.confidence``, that share and ``min_probability`` weighted 0.7 and
  0.3 (:func:`formline.pipeline.grounding.field_confidence`).

:func:`confidence_aurocs` is the probability that a right field scores above a wrong one
(ties count one half): 0.5 is no signal, 1.0 a perfect one.
"""

from __future__ import annotations

from typing import Any

from formline.pipeline.grounding import (
    NOTHING_TO_FIND,
    copied_confidence,
    grounded_share,
    weighted_confidence,
)

SIGNALS = (
    "min_probability",
    "mean_log_probability",
    "pressure",
    "grounded",
    "confidence",
)


def field_signals(
    pressure: dict[str, Any],
    field: str,
    value: Any = None,
    source: str = "",
    verbatim: bool = False,
) -> dict[str, float]:
    """The signals of ``field`` (a dotted scored field) from a result's per-path pressure,
    and of ``value`` (the field's predicted value) against the task's ``source`` text;
    ``verbatim``: the values were narrowed to the source's, so ``confidence`` is
    :func:`~formline.pipeline.grounding.copied_confidence` (as ``Result.confidence``)."""
    entries = [
        entry
        for path, entry in pressure.items()
        if path == field or path.startswith((field + ".", field + "["))
    ]
    steps = sum(entry.content_steps for entry in entries)
    log_probability = sum(entry.log_probability for entry in entries)
    least = min((entry.min_probability for entry in entries), default=1.0)
    share = grounded_share(value, source)
    return {
        "min_probability": least,
        "mean_log_probability": log_probability / steps if steps else 0.0,
        "pressure": 1.0 - max((entry.max_removed for entry in entries), default=0.0),
        "grounded": NOTHING_TO_FIND if share is None else share,
        "confidence": copied_confidence(value, least)
        if verbatim
        else weighted_confidence(share, least),
    }


def auroc(confidences: list[float], correct: list[bool]) -> float | None:
    """P(a right field's confidence > a wrong one's), ties one half; ``None`` without both
    kinds. Costs O(right x wrong)."""
    right = [value for value, ok in zip(confidences, correct, strict=True) if ok]
    wrong = [value for value, ok in zip(confidences, correct, strict=True) if not ok]
    if not right or not wrong:
        return None
    wins = sum((r > w) + 0.5 * (r == w) for r in right for w in wrong)
    return wins / (len(right) * len(wrong))


def confidence_aurocs(records: list[dict[str, Any]]) -> dict[str, float | None]:
    """Per signal, its AUROC over every scored field of ``records`` that has signals (the
    constrained ones; free output has none)."""
    pairs = [
        (record["signals"][field], ok)
        for record in records
        for field, ok in record["scores"].items()
        if field in record.get("signals", {})
    ]
    return {
        signal: auroc([values[signal] for values, _ in pairs], [ok for _, ok in pairs])
        for signal in SIGNALS
    }
