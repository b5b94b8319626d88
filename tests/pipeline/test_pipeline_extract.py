"""``formline.extract``: every branch of the repair loop, escape hatches, one real-model run.

The loop is driven by a scripted stand-in backend: a real formline Vocabulary (so the schema
really compiles) whose ``generate`` returns scripted texts and finish reasons in order and
records the prompts and token budgets it was given.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field, ValidationInfo, field_validator

import formline
from formline.evaluation.dataset import extraction_dev_directory
from formline.pipeline.decoding import Generation
from formline.pipeline.escape_hatches import (
    add_other_option,
    apply_escape_hatches,
    hatch_fields,
    make_nullable,
)
from formline.pipeline.extract import (
    ATTEMPTS_EXHAUSTED,
    REPEATED_OUTPUT,
    TOKEN_CAP,
    Extraction,
    ExtractionFailed,
    Failed,
    extract,
    repair_messages,
)
from formline.pipeline.generate import without_rationale
from formline.pipeline.pressure import field_pressure
from formline.schema import SchemaError, compile_schema
from formline.vocab import Vocabulary
from scripted import ScriptedDecoder, ScriptedEngine, install_decoder

EXTRACTION = extraction_dev_directory()
SOURCE = "Ada Lovelace, 36, lives in London."
GOOD = '{"name":"Ada Lovelace","age":36,"city":"London"}'


def load_schema(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((EXTRACTION / "schemas" / f"{name}.json").read_text())
    return loaded


class Person(BaseModel):
    name: str
    age: int = Field(ge=0, le=130)
    city: str

    @field_validator("name")
    @classmethod
    def name_in_source(cls, name: str, info: ValidationInfo) -> str:
        source = (info.context or {}).get("source", "")
        if name not in source:
            raise ValueError(f"name {name!r} is not in the source text")
        return name


def extract_as_scripted(*arguments: Any, **options: Any) -> Extraction | Failed:
    """:func:`extract` without ``verbatim``: the scripted outputs below bypass the mask, and
    test the repair loop with values the text does not hold ("Paris", 999)."""
    return extract(*arguments, verbatim=False, **options)


@pytest.fixture
def scripted(smollm2_vocab: Vocabulary, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A scripted model and loop: each call of ``formline.generate`` gives the next
    ``(text, finish_reason)``."""
    return lambda *script: install_decoder(monkeypatch, ScriptedDecoder(smollm2_vocab, *script))


def test_first_try_success_returns_the_pydantic_instance(scripted: Any) -> None:
    backend = scripted(GOOD)
    result = extract_as_scripted(SOURCE, Person, backend, instruction="Extract the person.")
    assert isinstance(result, Extraction) and result.ok
    assert isinstance(result.value, Person)
    assert result.value.model_dump() == {"name": "Ada Lovelace", "age": 36, "city": "London"}
    assert [attempt.outcome for attempt in result.attempts] == ["accepted"]
    assert "Extract the person." in backend.prompts[0] and SOURCE in backend.prompts[0]
    assert result.usage["total_tokens"] == result.attempts[0].tokens > 0
    assert result.seconds > 0


def test_truncation_gets_a_larger_budget_and_no_feedback(scripted: Any) -> None:
    backend = scripted(('{"name":"Ada Lovelace","age', "length"), GOOD)
    result = extract_as_scripted(SOURCE, Person, backend, max_tokens=16)
    assert isinstance(result, Extraction) and len(result.attempts) == 2
    assert backend.max_tokens == [16, 32]
    assert (
        result.attempts[0].outcome == "truncated"
        and "max_tokens=16" in result.attempts[0].errors[0]
    )
    assert backend.prompts[1] == backend.prompts[0]  # only the budget changed


def test_truncation_at_the_token_cap_stops(scripted: Any) -> None:
    cut = [(f'{{"name":"{"A" * size}', "length") for size in range(1, 5)]
    backend = scripted(*cut)
    result = extract_as_scripted(SOURCE, Person, backend, max_tokens=8, max_attempts=5)
    assert isinstance(result, Failed) and result.reason == TOKEN_CAP
    assert backend.max_tokens == [8, 16, 32]  # capped at 4 x max_tokens


def test_json_the_budget_closed_is_a_cut_off_not_an_answer(llama_backend: Any) -> None:
    # A looping model under a small budget: the real decoding loop's closing policy ends the
    # list, so the JSON is valid, but its end was written by the budget, not the model.
    names = {
        "type": "object",
        "properties": {"names": {"type": "array", "items": {"type": "string"}}},
    }
    names |= {"required": ["names"], "additionalProperties": False}
    looping = '{"names":[' + '"Ada",' * 200
    engine = ScriptedEngine(llama_backend, looping, '{"names":["Ada","Grace"]}')
    result = extract("Ada and Grace wrote it.", names, engine, max_tokens=40, verbatim=False)
    assert isinstance(result, Extraction) and result.value == {"names": ["Ada", "Grace"]}
    first = result.attempts[0]
    assert first.outcome == "truncated" and first.finish_reason == "length"
    assert json.loads(first.text)["names"][:2] == ["Ada", "Ada"]
    assert "written to close the JSON" in first.errors[0]
    assert [attempt.max_tokens for attempt in result.attempts] == [40, 80]


def test_validation_error_is_fed_back_into_the_next_prompt(scripted: Any) -> None:
    invalid = '{"name":"Ada Lovelace","age":999,"city":"London"}'
    backend = scripted(invalid, GOOD)
    result = extract_as_scripted(SOURCE, Person, backend)
    assert isinstance(result, Extraction) and len(result.attempts) == 2
    assert result.attempts[0].outcome == "invalid"
    assert "age: Input should be less than or equal to 130" in result.attempts[0].errors
    assert "less than or equal to 130" in backend.prompts[1]
    assert "<assistant>\n" + invalid in backend.prompts[1]  # the rejected answer, as a turn
    assert "less than or equal" not in backend.prompts[0]


def test_user_validator_reads_the_source_from_the_context(scripted: Any) -> None:
    backend = scripted('{"name":"Grace Hopper","age":36,"city":"London"}', GOOD)
    result = extract_as_scripted(SOURCE, Person, backend)
    assert isinstance(result, Extraction)
    assert "name 'Grace Hopper' is not in the source text" in backend.prompts[1]


def test_schema_after_check_errors_are_fed_back_for_a_dict_schema(scripted: Any) -> None:
    backend = scripted('{"name":"Ada Lovelace","age":36}', GOOD)
    result = extract_as_scripted(SOURCE, load_schema("person"), backend)
    assert isinstance(result, Extraction)
    assert result.value == {"name": "Ada Lovelace", "age": 36, "city": "London"}
    assert "'city' is a required property" in backend.prompts[1]


def test_grounding_error_names_the_field_in_the_next_prompt(scripted: Any) -> None:
    backend = scripted('{"name":"Ada Lovelace","age":36,"city":"Paris"}', GOOD)
    result = extract_as_scripted(SOURCE, load_schema("person"), backend, ground=True)
    assert isinstance(result, Extraction) and len(result.attempts) == 2
    assert result.attempts[0].outcome == "ungrounded"
    assert "city = 'Paris'" in backend.prompts[1]


def test_grounding_checks_only_the_fields_asked_for(scripted: Any) -> None:
    backend = scripted('{"name":"Ada Lovelace","age":36,"city":"Paris"}')
    result = extract_as_scripted(SOURCE, load_schema("person"), backend, ground=["name", "age"])
    assert isinstance(result, Extraction) and result.value["city"] == "Paris"


def test_grounding_skips_enum_labels(scripted: Any) -> None:
    text = '{"category":"bug","summary":"Export fails","urgent":false}'
    backend = scripted(text)
    result = extract_as_scripted(
        "Export fails on every try.", load_schema("ticket"), backend, ground=True
    )
    assert isinstance(result, Extraction)  # "bug" is a label, not text from the source


def test_identical_repeated_output_fails_at_once(scripted: Any) -> None:
    invalid = '{"name":"Ada Lovelace","age":999,"city":"London"}'
    backend = scripted(invalid, invalid, GOOD)
    result = extract_as_scripted(SOURCE, Person, backend, max_attempts=3)
    assert isinstance(result, Failed) and not result.ok
    assert result.reason == REPEATED_OUTPUT
    assert [attempt.outcome for attempt in result.attempts] == ["invalid", "repeated"]
    assert result.errors[0] == "identical to attempt 1, already rejected"
    assert result.errors[1:] == result.attempts[0].errors  # what was wrong with it
    assert len(backend.script) == 1  # the third scripted output was never asked for


def test_attempts_exhausted_is_a_typed_failure(scripted: Any) -> None:
    outputs = [f'{{"name":"Ada Lovelace","age":{age},"city":"London"}}' for age in (200, 300)]
    backend = scripted(*outputs, ('{"name":"Ada', "length"))
    result = extract_as_scripted(SOURCE, Person, backend, max_attempts=3)
    assert isinstance(result, Failed) and result.reason == ATTEMPTS_EXHAUSTED
    assert [attempt.outcome for attempt in result.attempts] == ["invalid", "invalid", "truncated"]
    assert result.usage["total_tokens"] == sum(attempt.tokens for attempt in result.attempts)
    assert (
        result.usage["prompt_tokens"] + result.usage["completion_tokens"]
        == (result.usage["total_tokens"])
    )
    assert "300" in backend.prompts[2] and "200" not in backend.prompts[2]  # the latest only
    with pytest.raises(ExtractionFailed, match="attempts exhausted"):
        result.raise_()


def test_escape_hatches_on_a_pydantic_model_return_a_dict(scripted: Any) -> None:
    backend = scripted('{"name":"Ada Lovelace","age":null,"city":"London"}')
    result = extract_as_scripted(
        SOURCE, Person, backend, escape_hatches=["age"], describe_schema=True
    )
    assert isinstance(result, Extraction)
    assert result.value == {"name": "Ada Lovelace", "age": None, "city": "London"}
    assert '"null"' in backend.prompts[0]  # the changed schema is the one described


def test_arguments_are_checked(scripted: Any) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        extract_as_scripted(SOURCE, Person, scripted(), max_attempts=0)
    with pytest.raises(SchemaError, match="no field"):
        extract_as_scripted(SOURCE, Person, scripted(), escape_hatches=["nickname"])


def test_extract_is_exported_without_loading_an_engine() -> None:
    assert formline.extract is extract
    assert formline.Extraction is Extraction and formline.Failed is Failed


# -- escape hatches ---------------------------------------------------------------------


def test_make_nullable_changes_types_enums_and_wraps_the_rest() -> None:
    schema: dict[str, Any] = {
        "type": "object",
        "$defs": {"Place": {"type": "object", "properties": {"city": {"type": "string"}}}},
        "properties": {
            "age": {"type": "integer", "description": "years"},
            "size": {"type": ["integer", "string"]},
            "mood": {"type": "string", "enum": ["calm", "busy"]},
            "place": {"$ref": "#/$defs/Place", "description": "where"},
            "either": {"anyOf": [{"type": "integer"}, {"type": "boolean"}]},
        },
        "required": ["age", "size", "mood", "place", "either"],
    }
    original = copy.deepcopy(schema)
    fields = ["age", "size", "mood", "place", "either"]
    changed = make_nullable(schema, fields)
    assert schema == original
    properties = changed["properties"]
    assert properties["age"] == {"type": ["integer", "null"], "description": "years"}
    assert properties["size"]["type"] == ["integer", "string", "null"]
    assert properties["mood"]["enum"] == ["calm", "busy", None]
    assert properties["place"] == {
        "description": "where",
        "anyOf": [{"$ref": "#/$defs/Place"}, {"type": "null"}],
    }
    assert properties["either"]["anyOf"][-1] == {"type": "null"}
    assert changed["required"] == original["required"]
    assert make_nullable(changed, fields) == changed  # idempotent


def test_add_other_option_adds_other_and_a_reason_right_after() -> None:
    schema = load_schema("candidate")
    changed = add_other_option(schema, ["final_recommendation"])
    field = changed["properties"]["final_recommendation"]
    assert field["enum"] == ["hire", "reject", "hold", "other"]
    names = list(changed["properties"])
    assert names.index("final_recommendation_other") == names.index("final_recommendation") + 1
    assert "final_recommendation_other" not in changed["required"]
    custom = add_other_option(schema, ["final_recommendation"], reason_field="why_{field}")
    assert "why_final_recommendation" in custom["properties"]
    with pytest.raises(SchemaError, match="not a string enum"):
        add_other_option(schema, ["rate_skill_match"])
    with pytest.raises(SchemaError, match="no field"):
        add_other_option(schema, ["verdict"])


def test_hatches_follow_nested_paths_and_leave_shared_definitions_alone() -> None:
    class Colour(BaseModel):
        shade: Literal["red", "blue"]

    class Palette(BaseModel):
        first: Colour
        second: Colour

    schema = Palette.model_json_schema()
    changed = add_other_option(schema, ["first.shade"])
    assert changed["properties"]["first"]["properties"]["shade"]["enum"][-1] == "other"
    assert changed["properties"]["second"] == {"$ref": "#/$defs/Colour"}
    assert changed["$defs"] == schema["$defs"]
    invoice = make_nullable(load_schema("invoice"), ["items[].unit_price"])
    assert invoice["properties"]["items"]["items"]["properties"]["unit_price"]["type"] == [
        "number",
        "null",
    ]


def test_hatch_fields_pick_required_scalars_and_string_enums() -> None:
    assert hatch_fields(load_schema("ticket")) == (["category", "summary", "urgent"], ["category"])
    nullable, enums = hatch_fields(load_schema("router"))
    assert "action.tool_name" not in nullable  # a const discriminator stays as it is
    assert enums == []


HATCHED_VALUES = {
    "person": {"name": None, "age": None, "city": "Lagos"},
    "contract": {"parties": ["A", "B"], "start_date": None, "notice_days": None},
    "ticket": {"category": "other", "category_other": "press", "summary": "Hi", "urgent": None},
    "invoice": {
        "vendor": None,
        "currency": "other",
        "items": [{"description": None, "quantity": None, "unit_price": 2.5}],
        "total": None,
    },
    "candidate": {
        "brief_candidate_summary": None,
        "rate_skill_match": None,
        "final_recommendation": "other",
        "final_recommendation_other": "pending",
    },
    "router": {"action": {"tool_name": "respond", "content": None}},
}


@pytest.mark.parametrize("name", sorted(HATCHED_VALUES))
def test_hatched_schemas_compile_and_accept_null_and_other(
    name: str, smollm2_vocab: Vocabulary
) -> None:
    original = load_schema(name)
    compiled = compile_schema(apply_escape_hatches(original, True), smollm2_vocab)
    value = HATCHED_VALUES[name]
    assert compiled.check(value) == []
    assert compile_schema(original, smollm2_vocab).check(value) != []
    matcher = compiled.matcher()
    assert matcher.accept_string(compiled.serialize(value)) and matcher.can_end()


# -- the real model ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama() -> Any:
    from formline.backends import load_backend

    return load_backend("llama_cpp", n_threads=1)


def test_real_model_extracts_one_task_per_type(llama: Any) -> None:
    lines = (EXTRACTION / "tasks.jsonl").read_text(encoding="utf-8").splitlines()
    tasks = [json.loads(line) for line in lines if line.strip()]
    chosen = [task for task in tasks if task["id"].endswith("-01")]
    assert len(chosen) == 6
    extracted = []
    for task in chosen:
        schema = load_schema(task["type"])
        result = extract(task["text"], schema, llama, instruction=task["instruction"])
        assert isinstance(result, Extraction | Failed) and result.attempts
        print(task["id"], type(result).__name__, [a.outcome for a in result.attempts])
        if isinstance(result, Extraction):
            assert compile_schema(schema, llama.vocabulary).check(result.value) == []
            extracted.append(task["id"])
    assert len(extracted) >= 4, extracted


class Lifespan(BaseModel):
    name: str
    age: int


def test_thinking_first_keeps_the_rationale_out_of_the_value(llama_backend: Any) -> None:
    # On the embedded model, greedy: 32 free tokens first turn age 27 (no thinking) into 36.
    result = formline.extract(
        "Ada Lovelace was thirty-six when she died.", Lifespan, llama_backend, think=32,
        temperature=0,
    )  # fmt: skip
    assert isinstance(result, Extraction), result
    attempt = result.attempts[0]
    assert attempt.rationale and "{" not in attempt.rationale
    assert attempt.text.lstrip().startswith("{")  # the answer alone
    assert set(attempt.pressure) <= {"", "name", "age"}  # no path from the rationale
    assert result.value.name == "Ada Lovelace"
    print("think=32:", result.value, repr(attempt.rationale))


def test_a_rationale_cut_inside_a_character_is_still_cut_from_the_answer() -> None:
    # The budget of free tokens ended after the first token of a split character ("世" is
    # e4 b8 96): the text holds a replacement character there, not those two bytes.
    rationale = "Ada, 世".encode()[:-1]
    text = (rationale + b'{"age":36}').decode("utf-8", errors="replace")
    generation = Generation([], text, "stop", prompt_tokens=1, completion_tokens=3)
    assert without_rationale(generation, rationale).text == '{"age":36}'
    assert without_rationale(generation, b"Other").text == text  # not its rationale: kept


def test_pressure_skips_the_rationale_bytes() -> None:
    pieces = [b"It is [x", b'{"a":', b"1}"]
    steps = {position: (0.5, False, -1) for position in range(3)}
    pressure = field_pressure([0, 1, 2], pieces, steps, answer_from=len(pieces[0]))
    assert set(pressure) == {"a"} and pressure["a"].steps == 2  # the key's token and the value's
    unskipped = field_pressure([0, 1, 2], pieces, steps)
    assert any(path.startswith("[") for path in unskipped)  # the rationale's "[" read as JSON


def test_extraction_copies_the_values_from_the_text_by_default(llama_backend: Any) -> None:
    # Greedy on the embedded model: age 27 with verbatim=False (issue 17's example), 36 with
    # the default, the only number the sentence states ("thirty-six").
    sentence = "Ada Lovelace was thirty-six when she died."
    result = formline.extract(sentence, Lifespan, llama_backend, temperature=0)
    assert isinstance(result, Extraction), result
    assert result.value == Lifespan(name="Ada Lovelace", age=36)
    free = formline.extract(sentence, Lifespan, llama_backend, temperature=0, verbatim=False)
    assert isinstance(free, Extraction) and free.value.name in sentence


def test_a_long_error_in_the_feedback_keeps_what_failed_and_where() -> None:
    # Cut at its end, a 276-character error reached the model as the quoted value alone.
    error = f"{'x' * 250!r} is too long (at /summary)"
    feedback = repair_messages("Extract.", "{}", [error])[-1]["content"]
    listed = feedback.splitlines()[1]
    assert listed.endswith("is too long (at /summary)") and len(listed) <= 2 + 200
