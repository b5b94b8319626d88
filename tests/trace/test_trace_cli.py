"""``formline trace``'s arguments and the page writer's way with a symbolic link (no model
loaded: each check fails before one would be)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from formline.cli.main import main
from formline.trace import write_trace_html

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
TRACE = {"prompt": "Ada", "constrained": {"steps": []}}


@pytest.mark.parametrize("temperature", ["nan", "inf", "-inf", "NaN"])
def test_a_temperature_that_is_not_finite_is_a_usage_error(
    temperature: str, tmp_path: Path, capsys: Any
) -> None:
    # at_least(0.0) let nan and inf through; the page's JSON (no NaN allowed) then failed
    # after the whole recording.
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA), encoding="utf-8")
    arguments = ["trace", "Ada", "--schema", str(schema), f"--temperature={temperature}"]
    with pytest.raises(SystemExit) as exit_info:
        main([*arguments, "--out", str(tmp_path / "t.html")])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "--temperature" in error and ("finite" in error or "at least" in error)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["schema.json"]


def test_writing_through_a_symbolic_link_writes_the_file_it_names(tmp_path: Path) -> None:
    # The temporary file went beside the link's target but was renamed onto the link: the
    # link was replaced by the page and its target kept the old one.
    target_folder, link_folder = tmp_path / "pages", tmp_path / "links"
    target_folder.mkdir()
    link_folder.mkdir()
    target = target_folder / "trace.html"
    target.write_text("OLD PAGE", encoding="utf-8")
    link = link_folder / "trace.html"
    link.symlink_to(target)
    assert write_trace_html(TRACE, link) == link
    assert link.is_symlink() and link.resolve() == target.resolve()
    assert 'id="trace-data"' in target.read_text(encoding="utf-8")
    assert sorted(os.listdir(target_folder)) == ["trace.html"]  # no temporary file left
    assert sorted(os.listdir(link_folder)) == ["trace.html"]


def test_a_link_to_another_device_is_written(tmp_path: Path) -> None:
    # The temporary file went to the target's device and os.replace onto the link, on
    # this one, failed (EXDEV). /dev/shm is a tmpfs where it exists.
    shared = Path("/dev/shm")
    if not shared.is_dir() or shared.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no folder on another device than the temporary folder")
    target = shared / f"formline-trace-{os.getpid()}.html"
    target.write_text("OLD PAGE", encoding="utf-8")
    try:
        link = tmp_path / "trace.html"
        link.symlink_to(target)
        write_trace_html(TRACE, link)
        assert link.is_symlink() and 'id="trace-data"' in target.read_text(encoding="utf-8")
    finally:
        target.unlink()
