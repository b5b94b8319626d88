"""The extraction-dev scoring rules: parsing, every comparison rule and its traps, the summary.

Each README rule has a right and a wrong hand-made prediction; the 72 gold objects (free-text
nulls filled as validate.py does, the rating range by its min or max) score 100%, over 186
scored field instances.
"""

from __future__ import annotations

import copy
import json
import math
import unicodedata
from typing import Any

import pytest

from formline.evaluation.dataset import extraction_dev_directory
from formline.evaluation.scoring import SCORED_FIELDS, parse_output, score_task, summarize

EXTRACTION = extraction_dev_directory()
PLACEHOLDER = "PLACEHOLDER"

PERSON = {"name": "Tomasz Wójcik", "age": 29, "city": "Kraków"}
CONTRACT = {"parties": ["Amina Diallo", "Sahel Solar SARL"], "start_date": "2025-07-07"}
TICKET = {"category": "billing", "summary": None, "urgent": True}
INVOICE = {
    "vendor": "Copperline Print Shop",
    "currency": "USD",
    "items": [
        {"description": None, "quantity": 500, "unit_price": 0.12},
        {"description": None, "quantity": 2, "unit_price": 45.0},
    ],
    "total": 150.0,
}
CANDIDATE = {
    "brief_candidate_summary": None,
    "rate_skill_match": {"min": 1, "max": 3},
    "final_recommendation": "reject",
}
FETCH = {"action": {"tool_name": "fetch_user_features", "rationale": None, "user_id": "70921"}}
RESPOND = {"action": {"tool_name": "respond", "content": None}}


def make_task(kind: str, gold: dict[str, Any], difficulty: str = "standard") -> dict[str, Any]:
    return {"id": f"{kind}-99", "type": kind, "gold": gold, "difficulty": difficulty}


def changed(gold: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A copy of ``gold`` (free text filled, the rating at its min) with ``fields`` replaced."""
    prediction = fill_free_text(make_task("", gold))
    prediction.update(fields)
    return prediction


def fill_free_text(task: dict[str, Any], rating: str | None = "min") -> dict[str, Any]:
    """The gold as a schema-valid prediction: placeholders for free text, the range's bound."""
    prediction = copy.deepcopy(task["gold"])
    for key in ("summary", "brief_candidate_summary"):
        if key in prediction:
            prediction[key] = PLACEHOLDER
    for item in prediction.get("items", []):
        item["description"] = PLACEHOLDER
    for key in ("rationale", "content"):
        if key in prediction.get("action", {}):
            prediction["action"][key] = PLACEHOLDER
    if rating is not None and "rate_skill_match" in prediction:
        prediction["rate_skill_match"] = prediction["rate_skill_match"][rating]
    return prediction


def development_tasks() -> list[dict[str, Any]]:
    lines = (EXTRACTION / "tasks.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def test_parse_output_strict_json_is_also_lenient() -> None:
    assert parse_output('  {"age": 29}\n') == ({"age": 29}, True, True)
    assert parse_output("[1, 2]") == ([1, 2], True, True)


@pytest.mark.parametrize(
    "text",
    [
        'Here you go:\n```json\n{"age": 29}\n```\nHope this helps.',
        '```\n{"age": 29}\n```',
        '```JSON\n{"age": 29}',  # an unclosed fence runs to the end
        'Sure! {"age": 29} is the answer.',
    ],
)
def test_parse_output_strips_fences_and_prose(text: str) -> None:
    assert parse_output(text) == ({"age": 29}, False, True)


def test_parse_output_braces_and_escaped_quotes_inside_strings_do_not_end_the_object() -> None:
    text = 'Result: {"note": "a } and a \\"}\\" here", "n": {"m": 1}} -- end {'
    assert parse_output(text) == ({"note": 'a } and a "}" here', "n": {"m": 1}}, False, True)


@pytest.mark.parametrize(
    "text",
    ['{"age": 29', "no JSON here", '```json\nnot json\n```\n{"age": 29}', ""],
)
def test_parse_output_failures_give_none_and_two_false_flags(text: str) -> None:
    assert parse_output(text) == (None, False, False)


def test_scored_fields_are_the_readme_table() -> None:
    assert SCORED_FIELDS == {
        "person": ["name", "age", "city"],
        "contract": ["parties", "start_date", "notice_days"],
        "ticket": ["category", "urgent"],
        "invoice": ["vendor", "currency", "items", "total"],
        "candidate": ["rate_skill_match", "final_recommendation"],
        "router": ["action.tool_name", "action.user_id"],
    }


def reordered_items(*pairs: tuple[Any, Any]) -> list[dict[str, Any]]:
    return [{"description": "any", "quantity": q, "unit_price": p} for q, p in pairs]


NULL_NOTICE = {**CONTRACT, "notice_days": None}
SIXTY_NOTICE = {**CONTRACT, "notice_days": 60}
DECOMPOSED_CITY = unicodedata.normalize("NFD", "Kraków")

RULE_CASES = [
    # strings: trimmed, case-folded, NFC first; a non-string is wrong
    ("person", PERSON, {"name": "  tomasz WÓJCIK "}, "name", True),
    ("person", PERSON, {"name": "Tomasz"}, "name", False),
    ("person", PERSON, {"city": DECOMPOSED_CITY}, "city", True),
    ("person", PERSON, {"city": "Krakow"}, "city", False),
    ("person", PERSON, {"city": ["Kraków"]}, "city", False),
    # numbers: exact value, never a string or a boolean
    ("person", PERSON, {"age": 29}, "age", True),
    ("person", PERSON, {"age": 29.0}, "age", True),
    ("person", PERSON, {"age": "29"}, "age", False),
    ("person", PERSON, {"age": 30}, "age", False),
    ("person", {**PERSON, "age": 1}, {"age": True}, "age", False),
    ("person", {**PERSON, "age": 1}, {"age": 1}, "age", True),
    # money: within 0.01
    ("invoice", INVOICE, {"total": 150.01}, "total", True),
    ("invoice", INVOICE, {"total": 149.99}, "total", True),
    ("invoice", INVOICE, {"total": 150.02}, "total", False),
    ("invoice", INVOICE, {"total": "150.00"}, "total", False),
    # enums: exact and case-sensitive
    ("ticket", TICKET, {"category": "billing"}, "category", True),
    ("ticket", TICKET, {"category": "Billing"}, "category", False),
    ("ticket", TICKET, {"category": " billing"}, "category", False),
    ("invoice", INVOICE, {"currency": "usd"}, "currency", False),
    ("candidate", CANDIDATE, {"final_recommendation": "Reject"}, "final_recommendation", False),
    # booleans: JSON true/false only
    ("ticket", TICKET, {"urgent": True}, "urgent", True),
    ("ticket", TICKET, {"urgent": 1}, "urgent", False),
    ("ticket", TICKET, {"urgent": "true"}, "urgent", False),
    ("ticket", {**TICKET, "urgent": False}, {"urgent": False}, "urgent", True),
    ("ticket", {**TICKET, "urgent": False}, {"urgent": 0}, "urgent", False),
    # null gold: only null; an integer gold is not null
    ("contract", NULL_NOTICE, {"notice_days": None}, "notice_days", True),
    ("contract", NULL_NOTICE, {"notice_days": 0}, "notice_days", False),
    ("contract", NULL_NOTICE, {"notice_days": ""}, "notice_days", False),
    ("contract", NULL_NOTICE, {"notice_days": 90}, "notice_days", False),
    ("contract", SIXTY_NOTICE, {"notice_days": 60}, "notice_days", True),
    ("contract", SIXTY_NOTICE, {"notice_days": None}, "notice_days", False),
    ("contract", SIXTY_NOTICE, {"notice_days": "60"}, "notice_days", False),
    # parties: sets after trim and case-fold
    ("contract", NULL_NOTICE, {"parties": ["sahel solar sarl ", "Amina Diallo"]}, "parties", True),
    (
        "contract",
        NULL_NOTICE,
        {"parties": ["Amina Diallo", "Sahel Solar SARL", "amina diallo"]},
        "parties",
        True,
    ),
    ("contract", NULL_NOTICE, {"parties": ["Amina Diallo", "Amina Diallo"]}, "parties", False),
    (
        "contract",
        NULL_NOTICE,
        {"parties": ["Amina Diallo", "Sahel Solar SARL", "Sahel Bank"]},
        "parties",
        False,
    ),
    ("contract", NULL_NOTICE, {"parties": "Amina Diallo, Sahel Solar SARL"}, "parties", False),
    ("contract", NULL_NOTICE, {"parties": ["Amina Diallo", 7]}, "parties", False),
    ("contract", NULL_NOTICE, {"start_date": " 2025-07-07"}, "start_date", True),
    ("contract", NULL_NOTICE, {"start_date": "2025-07-06"}, "start_date", False),
    # invoice items: same length, one-to-one on quantity and unit price, order ignored
    ("invoice", INVOICE, {"items": reordered_items((2, 45), (500, 0.12))}, "items", True),
    ("invoice", INVOICE, {"items": reordered_items((500, 0.125), (2.0, 45))}, "items", True),
    ("invoice", INVOICE, {"items": reordered_items((500, 0.12))}, "items", False),
    ("invoice", INVOICE, {"items": reordered_items((500, 0.12), (3, 45))}, "items", False),
    ("invoice", INVOICE, {"items": reordered_items((500, 0.12), (2, "45"))}, "items", False),
    (
        "invoice",
        INVOICE,
        {"items": reordered_items((500, 0.12), (2, 45), (1, 0))},
        "items",
        False,
    ),
    ("invoice", INVOICE, {"items": [{"quantity": 500, "unit_price": 0.12}, 2]}, "items", False),
    # candidate rating: an integral number inside the range (the gold range here is 1 to 3)
    ("candidate", CANDIDATE, {"rate_skill_match": 1}, "rate_skill_match", True),
    ("candidate", CANDIDATE, {"rate_skill_match": 3}, "rate_skill_match", True),
    ("candidate", CANDIDATE, {"rate_skill_match": 2.0}, "rate_skill_match", True),
    ("candidate", CANDIDATE, {"rate_skill_match": True}, "rate_skill_match", False),
    ("candidate", CANDIDATE, {"rate_skill_match": 2.5}, "rate_skill_match", False),
    ("candidate", CANDIDATE, {"rate_skill_match": "2"}, "rate_skill_match", False),
    ("candidate", CANDIDATE, {"rate_skill_match": 4}, "rate_skill_match", False),
    ("candidate", CANDIDATE, {"rate_skill_match": 0}, "rate_skill_match", False),
    ("candidate", CANDIDATE, {"rate_skill_match": math.nan}, "rate_skill_match", False),
    ("candidate", CANDIDATE, {"rate_skill_match": math.inf}, "rate_skill_match", False),
]


@pytest.mark.parametrize(("kind", "gold", "fields", "field", "expected"), RULE_CASES)
def test_each_rule_has_right_and_wrong_predictions(
    kind: str, gold: dict[str, Any], fields: dict[str, Any], field: str, expected: bool
) -> None:
    scores = score_task(make_task(kind, gold), changed(gold, **fields))
    assert scores[field] is expected
    assert all(correct for other, correct in scores.items() if other != field)


def test_candidate_rating_seven_point_zero_and_seven_and_true() -> None:
    task = make_task("candidate", {**CANDIDATE, "rate_skill_match": {"min": 7, "max": 10}})
    ratings = [7, 7.0, True, 7.01]
    results = [score_task(task, changed(task["gold"], rate_skill_match=r)) for r in ratings]
    assert [result["rate_skill_match"] for result in results] == [True, True, False, False]


def test_a_total_past_float_range_is_wrong_not_a_crash() -> None:
    # A model repeating "9" wrote a 400-digit total: abs(total - gold) raised OverflowError,
    # which ended the eval, and every resume decoded the same output again.
    task = make_task("invoice", INVOICE)
    assert score_task(task, changed(task["gold"], total=int("9" * 400)))["total"] is False
    assert score_task(task, task["gold"])["total"] is True


def test_items_are_matched_one_to_one_not_greedily() -> None:
    gold = {**INVOICE, "items": reordered_items((1, 10.0), (1, 10.02)), "total": 20.02}
    # the first guess fits both gold items, the second only the first one
    guesses = reordered_items((1, 10.01), (1, 10.0))
    assert score_task(make_task("invoice", gold), changed(gold, items=guesses))["items"]
    twice_the_same = reordered_items((1, 10.0), (1, 10.0))
    assert not score_task(make_task("invoice", gold), changed(gold, items=twice_the_same))["items"]


def test_router_user_id_is_scored_only_on_fetch_tasks() -> None:
    fetch, respond = make_task("router", FETCH), make_task("router", RESPOND)
    right = changed(FETCH)
    assert score_task(fetch, right) == {"action.tool_name": True, "action.user_id": True}
    spaced = {"action": {**right["action"], "user_id": " 70921 "}}
    assert score_task(fetch, spaced)["action.user_id"]
    for wrong_id in (70921, "7092", None):
        wrong = {"action": {**right["action"], "user_id": wrong_id}}
        assert score_task(fetch, wrong) == {"action.tool_name": True, "action.user_id": False}
    id_under_respond = {"action": {"tool_name": "respond", "content": "x", "user_id": "70921"}}
    assert score_task(fetch, id_under_respond) == {
        "action.tool_name": False,
        "action.user_id": False,
    }
    capitalized_tool = {"action": {**right["action"], "tool_name": "Fetch_user_features"}}
    assert not any(score_task(fetch, capitalized_tool).values())
    assert score_task(respond, changed(RESPOND)) == {"action.tool_name": True}
    assert score_task(respond, right) == {"action.tool_name": False}


def test_missing_keys_and_unparsed_outputs_are_wrong_and_extra_keys_ignored() -> None:
    task = make_task("person", PERSON)
    assert score_task(task, {"name": "Tomasz Wójcik", "city": "Kraków"})["age"] is False
    assert all(score_task(task, {**PERSON, "extra": 1, "age_note": "29"}).values())
    for unparsed in (None, [PERSON], "Tomasz Wójcik", 29):
        assert score_task(task, unparsed) == {"name": False, "age": False, "city": False}
    contract = make_task("contract", NULL_NOTICE)
    assert not score_task(contract, {"parties": CONTRACT["parties"]})["notice_days"]
    router = make_task("router", FETCH)
    assert score_task(router, {"action": "fetch_user_features"}) == {
        "action.tool_name": False,
        "action.user_id": False,
    }


def test_unknown_types_and_incomplete_golds_raise() -> None:
    with pytest.raises(ValueError, match="unknown task type"):
        score_task(make_task("recipe", {}), {})
    with pytest.raises(ValueError, match="lacks scored field 'city'"):
        score_task(make_task("person", {"name": "A", "age": 3}), PERSON)


@pytest.mark.parametrize("rating", ["min", "max"])
def test_the_gold_objects_score_every_field_correct(rating: str) -> None:
    tasks = development_tasks()
    assert len(tasks) == 72
    for task in tasks:
        text = json.dumps(fill_free_text(task, rating), ensure_ascii=False)
        value, strict, lenient = parse_output(text)
        assert strict and lenient
        scores = score_task(task, value)
        assert all(scores.values()), (task["id"], scores)
        expected = SCORED_FIELDS[task["type"]]
        if task["type"] == "router" and task["gold"]["action"]["tool_name"] == "respond":
            expected = ["action.tool_name"]
        assert list(scores) == expected


def test_summary_of_the_gold_has_186_field_instances_and_full_marks() -> None:
    tasks = development_tasks()
    summary = summarize([(task, score_task(task, fill_free_text(task))) for task in tasks])
    assert summary["scored_field_instances"] == 186 and summary["tasks"] == 72
    assert summary["all_fields_correct"]["overall"] == {"correct": 72, "total": 72, "accuracy": 1}
    totals = {field: rate["total"] for field, rate in summary["field_accuracy"].items()}
    assert totals["router.action.user_id"] == 6 and totals["router.action.tool_name"] == 12
    assert set(totals.values()) == {6, 12} and len(totals) == 16
    by_difficulty = summary["by_difficulty"]
    assert {level: group["tasks"] for level, group in by_difficulty.items()} == {
        "standard": 48,
        "hard": 24,
    }
    assert sum(group["scored_field_instances"] for group in by_difficulty.values()) == 186
    assert summary["notice_days_by_gold"]["null"]["total"] == 6
    assert summary["notice_days_by_gold"]["integer"]["total"] == 6


def test_summary_counts_errors_per_field_type_and_difficulty() -> None:
    tasks = development_tasks()
    pairs = []
    for task in tasks:
        prediction: Any = fill_free_text(task)
        if task["id"] == "person-01":
            prediction["age"] = "29"
        if task["id"] in ("contract-02", "contract-10"):  # null notices invented as 30 days
            prediction["notice_days"] = 30
        if task["id"] == "router-12":
            prediction = None
        pairs.append((task, score_task(task, prediction)))
    summary = summarize(pairs)
    assert summary["field_accuracy"]["person.age"] == {
        "correct": 11,
        "total": 12,
        "accuracy": 11 / 12,
    }
    assert summary["all_fields_correct"]["overall"]["correct"] == 68
    by_type = summary["all_fields_correct"]["by_type"]
    assert [by_type[kind]["correct"] for kind in ("person", "contract", "router")] == [11, 10, 11]
    hard = summary["by_difficulty"]["hard"]
    assert hard["field_accuracy"]["contract.notice_days"]["correct"] == 3
    assert hard["field_accuracy"]["router.action.tool_name"]["correct"] == 3
    assert hard["all_fields_correct"]["overall"]["correct"] == 22
    assert summary["by_difficulty"]["standard"]["field_accuracy"]["person.age"]["correct"] == 7
    assert summary["notice_days_by_gold"]["null"]["correct"] == 4
    assert summary["notice_days_by_gold"]["integer"]["correct"] == 6
    assert summarize([])["all_fields_correct"]["overall"]["accuracy"] is None
