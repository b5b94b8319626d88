"""The extraction-dev set shipped with formline: ``formline eval``'s default, complete, the
version its SOURCE.md names, and declared as package data so an installed formline has it."""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections import Counter
from pathlib import Path

from jsonschema import Draft202012Validator

from formline.evaluation.cli import _shown, default_tasks
from formline.evaluation.dataset import extraction_dev_directory, extraction_dev_tasks
from formline.evaluation.runner import load_tasks

ROOT = Path(__file__).resolve().parents[2]
TYPES = ("person", "contract", "ticket", "invoice", "candidate", "router")


def test_the_default_tasks_are_the_shipped_set() -> None:
    assert default_tasks() == extraction_dev_tasks()
    tasks = load_tasks(default_tasks())
    assert len(tasks) == 72
    assert Counter(task["type"] for task in tasks) == {name: 12 for name in TYPES}
    assert Counter(task["difficulty"] for task in tasks) == {"standard": 48, "hard": 24}
    for task in tasks:
        Draft202012Validator.check_schema(task["schema_json"])
    # results name the shipped set by its place in the package, not by this machine's path
    assert _shown(default_tasks()).startswith("formline/evaluation/data/extraction-dev/")


def test_the_files_are_the_version_source_md_names() -> None:
    directory = extraction_dev_directory()
    source = (directory / "SOURCE.md").read_text(encoding="utf-8")
    listed = dict(re.findall(r"^\| `([^`]+)` \| `([0-9a-f]{64})` \|$", source, re.MULTILINE))
    shipped = {
        path.relative_to(directory).as_posix()
        for path in directory.rglob("*")
        if path.is_file() and path.name != "SOURCE.md"
    }
    assert set(listed) == shipped
    for name, digest in listed.items():
        assert hashlib.sha256((directory / name).read_bytes()).hexdigest() == digest, name


def test_every_shipped_file_is_package_data() -> None:
    """A file the pyproject globs miss would be absent from an installed formline."""
    package = ROOT / "src" / "formline" / "evaluation"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = pyproject["tool"]["setuptools"]["package-data"]["formline.evaluation"]
    declared = {path for pattern in patterns for path in package.glob(pattern)}
    shipped = {path for path in (package / "data").rglob("*") if path.is_file()}
    assert shipped and shipped <= declared, sorted(map(str, shipped - declared))
