"""The one decoding loop, driven by scripted logits over the real SmolLM2 tokenizer: stop
tokens, the grammar's end, forced text in the prompt's pass, closing within the budget,
listeners in step order, deadlines and cancellation."""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, field_validator

from formline.backends.base import BackendError
from formline.constraint import Choice, Constraint, Regex
from formline.pipeline.decoding import Sampling, choose_token, decode
from formline.pipeline.generate import InvalidOutput, TruncatedOutput, generate
from formline.pipeline.listeners import StepListener
from scripted import ScriptedEngine

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
ANSWER = '{"name":"Ada Lovelace","age":36}'
PROMPT = "<|im_start|>user\nWho?<|im_end|>\n<|im_start|>assistant\n"


def person_plan(vocabulary: Any) -> Any:
    return Constraint.of(PERSON).compile(vocabulary)


def test_free_text_stops_on_the_stop_token_which_is_not_output(llama_backend: Any) -> None:
    engine = ScriptedEngine(llama_backend, "Hello there.")
    result = decode(engine, PROMPT, None, Sampling())
    assert (result.text, result.finish_reason) == ("Hello there.", "stop")
    assert result.completion_tokens == len(result.token_ids) == result.forward_passes - 1
    assert not set(result.token_ids) & llama_backend.vocabulary.eos_ids
    assert result.step_pressure == {}  # free steps are not measured


def test_constrained_output_shares_the_prompt_pass_with_forced_text(llama_backend: Any) -> None:
    plan = person_plan(llama_backend.vocabulary)
    engine = ScriptedEngine(llama_backend, ANSWER)
    result = decode(engine, PROMPT, plan.matcher(), Sampling())
    assert json.loads(result.text) == {"name": "Ada Lovelace", "age": 36}
    assert result.finish_reason == "stop"
    opening = engine.fed[len(engine.tokenize_prompt(PROMPT)) :][:2]
    assert b"".join(llama_backend.vocabulary.token_bytes[t] for t in opening).startswith(b'{"')
    assert result.forward_passes_saved == result.extra["jump_forward_tokens"] > 0
    # The grammar ends on '}': no pass to sample a stop token after it.
    sampled = result.completion_tokens - result.forward_passes_saved
    assert sampled == result.forward_passes
    assert set(result.step_pressure) <= set(range(result.completion_tokens))


def test_without_jump_forward_every_token_is_sampled(llama_backend: Any) -> None:
    plan = person_plan(llama_backend.vocabulary)
    engine = ScriptedEngine(llama_backend, ANSWER)
    result = decode(engine, PROMPT, plan.matcher(), Sampling(jump_forward=False))
    assert result.text == ANSWER and result.forward_passes_saved == 0
    assert len(result.step_pressure) == result.completion_tokens == result.forward_passes


# A list of names, and a model that repeats one name until something closes the list.
NAMES = {
    "type": "object",
    "properties": {"names": {"type": "array", "items": {"type": "string"}}},
    "required": ["names"],
    "additionalProperties": False,
}
LOOPING = '{"names":[' + '"Ada",' * 200


def test_a_looping_model_is_closed_within_the_budget(llama_backend: Any) -> None:
    plan = Constraint.of(NAMES).compile(llama_backend.vocabulary)
    result = decode(
        ScriptedEngine(llama_backend, LOOPING), PROMPT, plan.matcher(), Sampling(max_tokens=40)
    )
    assert result.finish_reason == "stop" and result.closing_tokens > 0
    assert result.completion_tokens <= 40
    assert json.loads(result.text)["names"][:3] == ["Ada", "Ada", "Ada"]


def test_a_context_that_ends_before_max_tokens_is_closed_within_it(llama_backend: Any) -> None:
    # The closing counted tokens left from max_tokens alone: a context that ended first cut
    # the value off mid-string, unclosed ({"names":["Ada","Ada","A), "length".
    plan = Constraint.of(NAMES).compile(llama_backend.vocabulary)
    prompt_tokens = len(llama_backend.tokenize_prompt(PROMPT))
    engine = ScriptedEngine(llama_backend, LOOPING, context_size=prompt_tokens + 40)
    result = decode(engine, PROMPT, plan.matcher(), Sampling(max_tokens=500))
    assert result.finish_reason == "stop" and result.closing_tokens > 0
    assert result.prompt_tokens + result.completion_tokens <= prompt_tokens + 40
    assert json.loads(result.text)["names"][:3] == ["Ada", "Ada", "Ada"]


@pytest.mark.parametrize("spare", [0, 1, 2, 3])
def test_an_answer_that_fits_the_budget_is_the_models_own(llama_backend: Any, spare: int) -> None:
    # The closing policy acts only when the model's next token would leave no room for a
    # completion: closing two tokens early wrote {"name":"Ada Lovelace","age":0} here.
    plan = person_plan(llama_backend.vocabulary)
    needed = len(llama_backend.tokenize(ANSWER.encode()))
    engine = ScriptedEngine(llama_backend, ANSWER)
    sampling = Sampling(max_tokens=needed + spare)
    result = decode(engine, PROMPT, plan.matcher(), sampling)
    assert (result.text, result.closing_tokens, result.finish_reason) == (ANSWER, 0, "stop")


def test_a_closed_value_is_reported_as_cut_off_by_generate(llama_backend: Any) -> None:
    result = generate(
        "Who?", NAMES, ScriptedEngine(llama_backend, LOOPING), max_tokens=40, describe_schema=False
    )
    assert result.usage["closing_tokens"] > 0 and result.finish_reason == "length"
    assert result.data == json.loads(result.text) and result.errors == []
    with pytest.raises(TruncatedOutput, match="written to close") as caught:
        _ = result.value
    assert caught.value.closing_tokens == result.usage["closing_tokens"]


def test_a_refused_continuation_changes_the_output_not_the_guarantee(llama_backend: Any) -> None:
    plan = person_plan(llama_backend.vocabulary)
    engine = ScriptedEngine(llama_backend, '{"name":"Ada","age":"36"}')  # a string age
    result = decode(engine, PROMPT, plan.matcher(), Sampling(max_tokens=30))
    assert plan.check(json.loads(result.text)) == []
    assert result.text.startswith('{"name":"Ada","age":')


class Recorder(StepListener):
    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []

    def on_logits(self, position: int, logits: Any, matcher: Any, forward_seconds: float) -> None:
        assert forward_seconds >= 0
        self.events.append(("logits", position))

    def on_masked(self, position: int, logits: Any, bitmask_row: Any) -> None:
        self.events.append(("masked", position))

    def on_token(self, position: int, token: int, matcher: Any) -> None:
        self.events.append(("token", position))

    def on_output(self, output: list[int]) -> str | None:
        self.events.append(("output", len(output)))
        return "cancelled" if len(output) >= 3 else None


def test_listeners_see_each_step_in_order_and_can_stop_it(llama_backend: Any) -> None:
    recorder = Recorder()
    plan = Constraint("regex", "[a-z ]{1,60}").compile(llama_backend.vocabulary)
    engine = ScriptedEngine(llama_backend, "the quick brown fox jumps over the dog")
    result = decode(engine, PROMPT, plan.matcher(), Sampling(jump_forward=False), [recorder])
    assert result.finish_reason == "cancelled" and result.completion_tokens >= 3
    first = recorder.events[:4]
    assert first == [("output", 0), ("logits", 0), ("masked", 0), ("token", 0)]
    assert recorder.events[-1] == ("output", result.completion_tokens)  # the end is shown too


def test_a_deadline_and_a_feed_are_listeners_from_sampling(llama_backend: Any) -> None:
    seen: list[int] = []
    done = decode(
        ScriptedEngine(llama_backend, "Hello."), PROMPT, None, Sampling(on_tokens=seen.extend)
    )
    assert seen == done.token_ids
    late = Sampling(deadline=time.monotonic() - 1)
    starts: list[int] = []
    timed_out = decode(
        ScriptedEngine(llama_backend, "Hello."), PROMPT, None, late, [Starts(starts)]
    )
    assert timed_out.finish_reason == "timeout"
    assert timed_out.forward_passes == 0  # not even the prompt's pass, past the deadline
    assert starts == []  # a stream is not opened for it: the timeout is the answer
    done = decode(
        ScriptedEngine(llama_backend, "Hello."), PROMPT, None, Sampling(), [Starts(starts)]
    )
    assert starts == [done.prompt_tokens]


class Starts(StepListener):
    """Records each on_start's prompt length."""

    def __init__(self, seen: list[int]):
        self.seen = seen

    def on_start(self, prompt_tokens: int) -> None:
        self.seen.append(prompt_tokens)


def test_a_prompt_over_the_context_is_refused(llama_backend: Any) -> None:
    engine = ScriptedEngine(llama_backend, "x", context_size=4)
    with pytest.raises(BackendError, match="n_ctx"):
        decode(engine, PROMPT, None, Sampling())


def test_choose_token_greedy_sampled_and_refused() -> None:
    logits = np.array([0.0, 3.0, -np.inf, 1.0], dtype=np.float32)
    rng = np.random.default_rng(0)
    assert choose_token(logits, 0.0, 1.0, rng) == 1
    assert {choose_token(logits, 1.0, 1.0, rng) for _ in range(200)} == {0, 1, 3}
    assert {choose_token(logits, 1.0, 0.5, rng) for _ in range(50)} == {1}  # top-p nucleus
    with pytest.raises(RuntimeError, match="no token"):
        choose_token(np.full(3, -np.inf, dtype=np.float32), 0.0, 1.0, rng)


@pytest.mark.parametrize("temperature", [5e-324, 1e-308, 1e-200])
def test_a_tiny_temperature_is_greedy(temperature: float) -> None:
    # logits / temperature overflowed to inf, and the NaN softmax drew any token
    logits = np.array([0.5, 3.0, -np.inf, 1.0, 2.9], dtype=np.float32)
    rng = np.random.default_rng(0)
    assert {choose_token(logits, temperature, 1.0, rng) for _ in range(50)} == {1}
    assert {choose_token(logits, temperature, 0.5, rng) for _ in range(50)} == {1}


def sorted_nucleus_choice(
    logits: np.ndarray, temperature: float, top_p: float, rng: np.random.Generator
) -> int:
    """choose_token's draw by its definition: every allowed token sorted (stable)."""
    ids = np.flatnonzero(np.isfinite(logits))
    scaled = logits[ids].astype(np.float64) / temperature
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    cut = int(np.searchsorted(np.cumsum(probs[order]), top_p)) + 1
    ids, probs = ids[order[:cut]], probs[order[:cut]]
    cumulative = np.cumsum(probs)
    pick = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return int(ids[min(pick, ids.size - 1)])


@settings(max_examples=150, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.sampled_from([300, 3_000, 49_152]),
    st.sampled_from(["spread", "peaked", "ties", "masked"]),
    st.floats(0.05, 0.99),
    st.floats(0.3, 2.0),
)
def test_a_top_p_draw_is_the_full_sorts_draw(
    seed: int, size: int, shape: str, top_p: float, temperature: float
) -> None:
    # The nucleus is found among the likeliest tokens first (a sort of all 49,152 took 3-4
    # ms a step); the token drawn must be the one a sort of every allowed token gives.
    data = np.random.default_rng(seed)
    logits = (data.normal(size=size) * data.uniform(0.5, 6)).astype(np.float32)
    if shape == "peaked":
        logits[data.integers(0, size, 5)] += 12
    elif shape == "ties":
        logits = data.integers(0, 40, size).astype(np.float32) / 4
    elif shape == "masked":
        logits[data.random(size) < 0.9] = -np.inf
        logits[0] = 0.0  # one allowed at least
    chosen = choose_token(logits, temperature, top_p, np.random.default_rng(seed))
    assert chosen == sorted_nucleus_choice(logits, temperature, top_p, np.random.default_rng(seed))


ITEMS = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"label": {"type": "string"}, "count": {"type": "integer"}},
                "required": ["label", "count"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["items"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("max_tokens", [30, 41, 57, 64])
def test_a_token_that_would_overrun_the_budget_is_replaced_by_the_closing(
    llama_backend: Any, max_tokens: int
) -> None:
    # One ``},`` commits to another item with required fields: taken at the wrong moment it
    # leaves no room to close (seen on invoice-10, cut off at max_tokens).
    looping = '{"items":[' + ",".join('{"label":"apple pie","count":12}' for _ in range(40))
    plan = Constraint.of(ITEMS).compile(llama_backend.vocabulary)
    engine = ScriptedEngine(llama_backend, looping)
    result = decode(engine, PROMPT, plan.matcher(), Sampling(max_tokens=max_tokens))
    assert result.finish_reason == "stop" and result.completion_tokens <= max_tokens
    assert plan.check(json.loads(result.text)) == [] and result.closing_tokens > 0


class Adult(BaseModel):
    name: str
    age: int

    @field_validator("age")
    @classmethod
    def is_adult(cls, age: int) -> int:
        if age < 18:
            raise ValueError("must be an adult")
        return age


def test_a_models_own_validator_is_an_invalid_output(llama_backend: Any) -> None:
    # A validator states what no schema does: .value raised pydantic's ValidationError.
    engine = ScriptedEngine(llama_backend, '{"name":"Tim","age":12}')
    result = generate("Tim, 12.", Adult, engine, describe_schema=False)
    assert result.finish_reason == "stop"
    assert result.errors == ["age: Value error, must be an adult"]
    with pytest.raises(InvalidOutput, match="must be an adult"):
        _ = result.value


@pytest.mark.parametrize(
    ("output", "answer", "error"),
    [
        (Choice(["yes", "no"]), "Well, maybe.", "does not match the choice"),
        (Choice(["yes", "no"]), "ye", "ends before the choice does"),
        (Regex(r"[0-9]{4}-[0-9]{2}"), "2024-1", "ends before the regex does"),
    ],
)
def test_free_text_is_checked_against_a_regex_or_choice(
    llama_backend: Any, output: Any, answer: str, error: str
) -> None:
    # free=True promised a check; a paragraph came back as a choice's value.
    engine = ScriptedEngine(llama_backend, answer, "no")
    result = generate("Is it?", output, engine, free=True, describe_schema=False)
    assert result.text == answer and error in result.errors[0]
    with pytest.raises(InvalidOutput, match=error):
        _ = result.value
    if isinstance(output, Choice):
        assert generate("Is it?", output, engine, free=True).value == "no"
