"""Constraint pressure: steps attributed to JSON paths, aggregated, flagged."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from formline.mask.bitmask import (
    allocate_token_bitmask,
    apply_token_bitmask_inplace,
    ids_to_bitmask,
)
from formline.pipeline.pressure import PressureListener, byte_paths, field_pressure, top_level


def test_byte_paths_follow_keys_indices_and_nesting() -> None:
    text = b'{"name":"Ada","items":[{"d":"x","q":2},{"d":"y"}],"age":3}'
    runs = [
        (path, "".join(character for character, _ in group))
        for path, group in itertools.groupby(
            zip(text.decode(), byte_paths(text), strict=True), key=lambda pair: pair[1]
        )
    ]
    assert ("name", '"name":"Ada",') in runs
    assert ("items[0].q", '"q":2') in runs
    assert ("items[1].d", '"d":"y"') in runs
    assert ("age", '"age":3') in runs
    assert byte_paths(b'{"a":"x\\"y') == ["", "a", "a", "a", "a", "a", "a", "a", "a", "a"]


def test_field_pressure_aggregates_steps_on_the_fields_they_wrote() -> None:
    pieces = [b'{"', b"age", b'":', b"4", b"2", b',"', b"city", b'":"', b"Rio", b'"}']
    steps = {3: (0.9, True, 9), 4: (0.1, False, 4), 8: (0.05, False, 8)}
    pressure = field_pressure(range(len(pieces)), pieces, steps)
    assert pressure["age"].steps == 2 and pressure["age"].max_removed == 0.9
    assert pressure["age"].preferred_refused == 1 and pressure["age"].is_flagged()
    assert pressure["age"].content_max_removed == 0.1  # the 0.9 step preferred '"}' (9)
    assert not pressure["city"].is_flagged()
    assert set(top_level(pressure)) == {"age", "city"}


def test_values_the_budget_wrote_have_probability_zero() -> None:
    pieces = [b'{"', b"age", b'":', b"4", b"2", b',"', b"city", b'":"', b"Rio", b'"}']
    steps = {3: (0.0, False, 3), 4: (0.0, False, 4)}
    confidence = {3: 0.9, 4: 0.8}
    closed = field_pressure(range(len(pieces)), pieces, steps, confidence, closing_tokens=5)
    assert closed["age"].confidence == 0.8  # the model's own digits
    assert closed["city"].confidence == 0.0  # "Rio" came with the closing text
    sampled = field_pressure(range(len(pieces)), pieces, steps, confidence, closing_tokens=1)
    assert "city" not in sampled  # '"}' alone writes no value: nothing to mark


def test_the_pressure_listener_measures_removed_mass_and_refused_preference() -> None:
    logits = np.log(np.array([0.7, 0.2, 0.1], dtype=np.float32))
    bitmask = allocate_token_bitmask(1, 3)
    bitmask[0] = ids_to_bitmask(np.array([1, 2]), 1).view(np.int32)
    listener = PressureListener()
    listener.on_logits(4, logits, object(), 0.0)
    apply_token_bitmask_inplace(logits, bitmask[0])
    listener.on_masked(4, logits, bitmask[0])
    removed, refused, preferred = listener.steps[4]
    assert abs(removed - 0.7) < 1e-5 and refused and preferred == 0
    listener.on_logits(5, logits, None, 0.0)  # a free step is not measured
    assert list(listener.steps) == [4]


def test_results_carry_pressure_from_the_real_model(llama_backend: Any) -> None:
    from formline.pipeline.generate import generate

    schema = {
        "type": "object",
        "properties": {"age": {"type": "integer"}},
        "required": ["age"],
        "additionalProperties": False,
    }
    result = generate("How old is Ada? She is thirty-six.", schema, llama_backend, max_tokens=20)
    assert "age" in result.pressure and result.pressure["age"].steps >= 1
    assert all(0.0 <= entry.max_removed <= 1.0 for entry in result.pressure.values())
