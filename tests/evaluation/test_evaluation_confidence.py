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
        "grounded": 0.5, "confidence": pytest.approx(0.7 * 0.5 + 0.3),
    }  # fmt: skip
    found = field_signals(pressure, "name", "Ada Lovelace", "Ada Lovelace, 36.")
    missing = field_signals(pressure, "name", "Grace Hopper", "Ada Lovelace, 36.")
    assert (found["grounded"], missing["grounded"]) == (1.0, 0.0)
    assert found["confidence"] == pytest.approx(0.7 + 0.3 * 0.99)
    assert missing["confidence"] == pytest.approx(0.3 * 0.99)
    records = [
        {"scores": {"name": True, "items": False}, "signals": {
            "name": field_signals(pressure, "name"), "items": signals}},
    ]  # fmt: skip
    assert confidence_aurocs(records)["min_probability"] == 1.0


def test_a_value_the_mask_forced_against_the_model_has_low_confidence(llama_backend: Any) -> None:
    # The model "wants" to write the age as a word; the grammar forces digits.
    engine = ScriptedEngine(llama_backend, '{"name":"Ada","age":"thirty-six"}')
    result = generate("Ada, thirty-six.", Person, engine, max_tokens=30)
    assert result.model_confidence["name"] > 0.99  # written as the model wanted
    assert result.model_confidence["age"] < 1e-20  # every digit was refused by the model
    assert result.source == "Ada, thirty-six."
    age = result.value.age
    found = 1.0 if age == 36 else 0.0  # the digits the grammar forced, read in the words?
    expected = 0.7 * found + 0.3 * result.model_confidence["age"]
    assert result.confidence["age"] == pytest.approx(expected)


def test_result_confidence_ranks_a_value_from_the_text_above_an_invented_one(
    llama_backend: Any,
) -> None:
    # Both fields written as the model wanted; only one of them is in the prompt's text.
    engine = ScriptedEngine(llama_backend, '{"name":"Grace","age":36}')
    messages = [
        {"role": "system", "content": "Names such as Grace are common."},
        {"role": "user", "content": "Ada, thirty-six."},
    ]
    result = generate(messages, Person, engine, max_tokens=30)
    assert result.value == Person(name="Grace", age=36)
    assert result.source == "Ada, thirty-six."  # the system message is not a source
    assert min(result.model_confidence.values()) > 0.99
    assert result.confidence["age"] > 0.99  # 36 is "thirty-six" in the text
    assert 0.29 < result.confidence["name"] < 0.31  # Grace is not: the model's 1.0 at 0.3
