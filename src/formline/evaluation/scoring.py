"""Scoring of extraction-dev outputs against their gold, following the set's README once.

Two steps: :func:`parse_output` turns the model's text into a JSON value (strictly, and
leniently after stripping Markdown fences and prose), then :func:`score_task` compares each
scored field of one task with its gold, and :func:`summarize` aggregates many tasks into
per-field accuracy and all-fields-correct rates, overall, per type and per difficulty.

The rules ("Scoring" in formline/evaluation/data/extraction-dev/README.md): strings are compared
after NFC, trimming and case-folding; numbers by exact value, never a string or a boolean; money
(invoice ``unit_price`` and ``total``) within 0.01; enums exactly; booleans must be JSON booleans; a
``null`` gold only equals ``null``; parties as sets; invoice items by one-to-one matching on
quantity and unit price; the candidate rating as an integer inside the gold range; the router
``user_id`` only on fetch tasks. A missing key or a wrong JSON type is wrong.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable, Iterable
from typing import Any

MONEY_TOLERANCE = 0.01
FLOAT_SLACK = 1e-9  # 150.01 - 150.0 is 0.0100000000000051 in binary floating point
FETCH_TOOL = "fetch_user_features"
_MISSING: Any = object()  # a key absent from the prediction (distinct from JSON null)
_FENCE = re.compile(r"```[A-Za-z0-9_+-]*[ \t]*\r?\n?(.*?)(?:```|\Z)", re.DOTALL)


def parse_output(text: str) -> tuple[Any | None, bool, bool]:
    """Parse a model output as JSON: ``(value or None, strict, lenient)``.

    ``strict`` is whether ``json.loads(text.strip())`` succeeds. ``lenient`` is whether the
    content of the first Markdown fence (```` ```json ... ``` ```` or ```` ``` ... ``` ````;
    an unclosed fence runs to the end) parses, or, when there is no fence, the first balanced
    ``{...}`` object in the text (the whole text when it has none). A strict parse also
    counts as lenient, so lenient acceptance includes strict acceptance. The value is the
    strict one when there is one, else the lenient one, else ``None`` (a JSON ``null``
    output is indistinguishable from a failure by value: read the flags). Never raises;
    costs O(len(text)) plus O(len(text) x braces) in the worst case of unbalanced braces.
    """
    value, strict = _loads(text)
    if strict:
        return value, True, True
    fence = _FENCE.search(text)
    candidate = fence.group(1) if fence else _first_balanced_object(text) or text
    value, lenient = _loads(candidate)
    return value, False, lenient


def _loads(text: str) -> tuple[Any | None, bool]:
    """``(value, True)`` when ``text`` stripped is JSON, else ``(None, False)``."""
    try:
        return json.loads(text.strip()), True
    except (ValueError, RecursionError):  # JSONDecodeError, int-size limit, deep nesting
        return None, False


def _first_balanced_object(text: str) -> str | None:
    """The first ``{...}`` span whose braces balance outside JSON strings, or ``None``."""
    start = text.find("{")
    while start != -1:
        depth, in_string, escaped = 0, False, False
        for index in range(start, len(text)):
            character = text[index]
            if escaped:
                escaped = False
            elif in_string:
                escaped = character == "\\"
                in_string = character != '"'
            elif character == '"':
                in_string = True
            elif character in "{}":
                depth += 1 if character == "{" else -1
                if depth == 0:
                    return text[start : index + 1]
        start = text.find("{", start + 1)
    return None


def _normalized(text: str) -> str:
    return unicodedata.normalize("NFC", text).strip().casefold()


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def same_string(predicted: Any, gold: Any) -> bool:
    """Equal strings after NFC, trimming and case-folding; a non-string is wrong."""
    return isinstance(predicted, str) and _normalized(predicted) == _normalized(gold)


def same_number(predicted: Any, gold: Any) -> bool:
    """Equal numeric value (29 == 29.0); strings and booleans are never numbers."""
    return _is_number(predicted) and bool(predicted == gold)


def same_money(predicted: Any, gold: Any) -> bool:
    """A number within 0.01 of the gold amount (an integer past float range is not: the
    float difference raised OverflowError, which ended the whole eval, and every resume)."""
    if not _is_number(predicted):
        return False
    try:
        return bool(abs(predicted - gold) <= MONEY_TOLERANCE + FLOAT_SLACK)
    except OverflowError:
        return False


def same_enum(predicted: Any, gold: Any) -> bool:
    """The exact, case-sensitive enum string ("Billing" is not "billing")."""
    return isinstance(predicted, str) and predicted == gold


def same_boolean(predicted: Any, gold: Any) -> bool:
    """A JSON boolean equal to the gold (1 is not true)."""
    return isinstance(predicted, bool) and predicted is gold


def same_parties(predicted: Any, gold: Any) -> bool:
    """Equal sets of party names under the string rule; duplicates and order are ignored."""
    if not isinstance(predicted, list) or not all(isinstance(name, str) for name in predicted):
        return False
    return {_normalized(name) for name in predicted} == {_normalized(name) for name in gold}


def same_items(predicted: Any, gold: Any) -> bool:
    """Same length and a one-to-one match on quantity and unit price (order ignored).

    Costs O(n^3) in the number of items (augmenting-path matching; n is at most 6 here).
    """
    if not isinstance(predicted, list) or len(predicted) != len(gold):
        return False
    candidates = [
        [position for position, item in enumerate(gold) if _same_item(guess, item)]
        for guess in predicted
    ]
    owners: dict[int, int] = {}  # gold position -> predicted position

    def assign(guess: int, visited: set[int]) -> bool:
        for position in candidates[guess]:
            if position not in visited:
                visited.add(position)
                if position not in owners or assign(owners[position], visited):
                    owners[position] = guess
                    return True
        return False

    return all(assign(guess, set()) for guess in range(len(predicted)))


def _same_item(predicted: Any, gold: dict[str, Any]) -> bool:
    return (
        isinstance(predicted, dict)
        and same_number(predicted.get("quantity", _MISSING), gold["quantity"])
        and same_money(predicted.get("unit_price", _MISSING), gold["unit_price"])
    )


def rating_in_range(predicted: Any, gold: Any) -> bool:
    """An integral number (7 or 7.0, not true or 7.5) with ``min <= value <= max``."""
    if not _is_number(predicted) or (isinstance(predicted, float) and not predicted.is_integer()):
        return False  # is_integer() is False for NaN and infinities too
    return bool(gold["min"] <= predicted <= gold["max"])


Rule = Callable[[Any, Any], bool]
_RULES: dict[str, dict[str, Rule]] = {
    "person": {"name": same_string, "age": same_number, "city": same_string},
    "contract": {"parties": same_parties, "start_date": same_string, "notice_days": same_number},
    "ticket": {"category": same_enum, "urgent": same_boolean},
    "invoice": {
        "vendor": same_string,
        "currency": same_enum,
        "items": same_items,
        "total": same_money,
    },
    "candidate": {"rate_skill_match": rating_in_range, "final_recommendation": same_enum},
    "router": {"action.tool_name": same_enum, "action.user_id": same_string},
}
SCORED_FIELDS: dict[str, list[str]] = {kind: list(rules) for kind, rules in _RULES.items()}


def task_types() -> frozenset[str]:
    """The task types this module scores (a task set of other types cannot be scored)."""
    return frozenset(_RULES)


def _lookup(value: Any, path: str) -> Any:
    """The value at a dotted path, or ``_MISSING`` when a step is absent or not an object."""
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            return _MISSING
        value = value[key]
    return value


def field_value(prediction: Any, path: str) -> Any:
    """The predicted value at a scored field's dotted path, ``None`` where it is absent."""
    found = _lookup(prediction, path)
    return None if found is _MISSING else found


def score_task(task: dict[str, Any], prediction: Any | None) -> dict[str, bool]:
    """Score one prediction: scored field name -> correct.

    ``prediction`` is the parsed output, ``None`` when it did not parse (every field wrong);
    a JSON ``null`` output scores the same. ``action.user_id`` is present only for tasks
    whose gold tool is ``fetch_user_features``. Raises ValueError for an unknown task type
    or a gold without a scored field. Costs O(size of the prediction's scored fields).
    """
    rules = _RULES.get(task.get("type", ""))
    if rules is None:
        raise ValueError(f"unknown task type {task.get('type')!r} in task {task.get('id')!r}")
    gold = task["gold"]
    is_fetch = _lookup(gold, "action.tool_name") == FETCH_TOOL
    scores: dict[str, bool] = {}
    for field, rule in rules.items():
        if field == "action.user_id" and not is_fetch:
            continue
        gold_value = _lookup(gold, field)
        if gold_value is _MISSING:
            raise ValueError(f"gold of task {task.get('id')!r} lacks scored field {field!r}")
        predicted = _lookup(prediction, field)
        if field == "action.user_id" and _lookup(prediction, "action.tool_name") != FETCH_TOOL:
            predicted = _MISSING  # an id under the respond tool (or none) does not count
        scores[field] = _score_field(rule, predicted, gold_value)
    return scores


def _score_field(rule: Rule, predicted: Any, gold: Any) -> bool:
    """One field's rule, after the common ones: missing is wrong, a null gold needs null."""
    if predicted is _MISSING:
        return False
    if gold is None:  # only contract.notice_days: 0, "" and a missing key are wrong
        return predicted is None
    return rule(predicted, gold)


def _rate(correct: int, total: int) -> dict[str, Any]:
    return {"correct": correct, "total": total, "accuracy": correct / total if total else None}


def _tally(scores: Iterable[tuple[dict[str, Any], dict[str, bool]]]) -> dict[str, Any]:
    """Per-field accuracy and all-fields-correct rates of one group of scored tasks."""
    fields: dict[str, list[int]] = {}  # "type.field" -> [correct, scored]
    types: dict[str, list[int]] = {}  # type -> [tasks all correct, tasks]
    for task, task_scores in scores:
        for field, correct in task_scores.items():
            counts = fields.setdefault(f"{task['type']}.{field}", [0, 0])
            counts[0] += correct
            counts[1] += 1
        counts = types.setdefault(task["type"], [0, 0])
        counts[0] += all(task_scores.values())
        counts[1] += 1
    return {
        "field_accuracy": {field: _rate(*counts) for field, counts in fields.items()},
        "all_fields_correct": {
            "overall": _rate(sum(c[0] for c in types.values()), sum(c[1] for c in types.values())),
            "by_type": {kind: _rate(*counts) for kind, counts in types.items()},
        },
        "scored_field_instances": sum(counts[1] for counts in fields.values()),
        "tasks": sum(counts[1] for counts in types.values()),
    }


def summarize(scores: list[tuple[dict[str, Any], dict[str, bool]]]) -> dict[str, Any]:
    """Aggregate ``(task, score_task(...))`` pairs into the README's report.

    Returns ``field_accuracy`` (``"type.field"`` -> correct, total, accuracy),
    ``all_fields_correct`` (``overall`` and ``by_type``), ``scored_field_instances`` (186
    for the 72 dev tasks), ``tasks``, ``by_difficulty`` (the same numbers per difficulty)
    and ``notice_days_by_gold`` (contract notice accuracy on null golds apart from integer
    ones). An accuracy is ``None`` when its total is 0. Raises KeyError for a task without
    ``type`` (or ``gold`` for contracts). Costs O(total scored fields).
    """
    report = _tally(scores)
    difficulties: dict[str, list[tuple[dict[str, Any], dict[str, bool]]]] = {}
    for pair in scores:
        difficulties.setdefault(str(pair[0].get("difficulty")), []).append(pair)
    report["by_difficulty"] = {level: _tally(group) for level, group in difficulties.items()}
    notice: dict[str, list[int]] = {"null": [0, 0], "integer": [0, 0]}
    for task, task_scores in scores:
        if task["type"] == "contract" and "notice_days" in task_scores:
            counts = notice["null" if task["gold"]["notice_days"] is None else "integer"]
            counts[0] += task_scores["notice_days"]
            counts[1] += 1
    report["notice_days_by_gold"] = {kind: _rate(*counts) for kind, counts in notice.items()}
    return report
