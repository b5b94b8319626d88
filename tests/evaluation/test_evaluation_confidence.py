"""Per-field confidence: the chosen tokens' unmasked probabilities, rolled onto fields, and
the AUROC that says whether they predict a wrong field."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from formline.evaluation.confidence import auroc, confidence_aurocs, field_signals
from formline.pipeline.generate import generate
from formline.pipeline.pressure import FieldPressure
from scripted import ScriptedEngine


class Person(BaseModel):
    name: str
    age: int


def test_auroc_orders_right_above_wrong() -> None:
    assert auroc([0.9, 0.8, 0.2], [True, True, False]) == 1.0
    assert auroc([0.1, 0.9], [True, False]) == 0.0
    assert auroc([0.5, 0.5], [True, False]) == 0.5
    assert auroc([0.5], [True]) is None


def test_signals_roll_a_field_up_from_its_paths() -> None:
    pressure = {
        "items[0].price": FieldPressure("items[0].price", 2, 0.4, 0.5, 0, 0.4, 0.5, -1.0, 2),
        "items[1].price": FieldPressure("items[1].price", 1, 0.1, 0.1, 0, 0.1, 0.2, -2.0, 1),
        "name": FieldPressure("name", 1, 0.0, 0.0, 0, 0.0, 0.99, -0.01, 1),
    }
    signals = field_signals(pressure, "items")
    assert signals["min_probability"] == 0.2
    assert signals["mean_log_probability"] == pytest.approx(-1.0)
    assert signals["pressure"] == pytest.approx(0.6)
    assert field_signals(pressure, "city") == {
        "min_probability": 1.0, "mean_log_probability": 0.0, "pressure": 1.0,
    }  # fmt: skip
    records = [
        {"scores": {"name": True, "items": False}, "signals": {
            "name": field_signals(pressure, "name"), "items": signals}},
    ]  # fmt: skip
    assert confidence_aurocs(records)["min_probability"] == 1.0


def test_a_value_the_mask_forced_against_the_model_has_low_confidence(llama_backend: Any) -> None:
    # The model "wants" to write the age as a word; the grammar forces digits.
    engine = ScriptedEngine(llama_backend, '{"name":"Ada","age":"thirty-six"}')
    result = generate("Ada, thirty-six.", Person, engine, max_tokens=30)
    assert result.confidence["name"] > 0.99  # written as the model wanted
    assert result.confidence["age"] < 1e-20  # every digit was refused by the model
