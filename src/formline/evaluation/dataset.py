"""The extraction-dev task set shipped with formline: ``formline eval``'s default tasks.

The set (72 tasks, six schemas, its README with the scoring rules; provenance and hashes in
its SOURCE.md) is package data under ``formline/evaluation/data/extraction-dev/``, so an
installed formline finds it as well as a checkout does. The tests and benchmarks read the
same copy through these functions.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

EXTRACTION_DEV = "extraction-dev"


def extraction_dev_directory() -> Path:
    """The folder of the shipped set: ``tasks.jsonl``, ``schemas/``, ``README.md``,
    ``SOURCE.md``.

    Raises:
        FileNotFoundError: the package data is missing (a broken install).
    """
    directory = Path(str(files("formline.evaluation") / "data" / EXTRACTION_DEV))
    if not (directory / "tasks.jsonl").is_file():
        raise FileNotFoundError(
            f"formline's extraction-dev task set is missing at {directory}; reinstall formline"
        )
    return directory


def extraction_dev_tasks() -> Path:
    """The shipped set's ``tasks.jsonl`` (schemas in ``schemas/`` next to it)."""
    return extraction_dev_directory() / "tasks.jsonl"
