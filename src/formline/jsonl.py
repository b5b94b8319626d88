"""JSON Lines files that runs append to and resume from (``formline extract``'s output,
``formline eval``'s records): read with line numbers, and mended after a run killed while
writing one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_numbered(path: Path) -> list[tuple[int, Any]]:
    """``(line number, value)`` of each non-blank line of ``path``.

    Raises:
        OSError: ``path`` cannot be read.
        ValueError: ``path:line`` of a line that is not JSON.
    Costs one read of the file.
    """
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append((number, json.loads(line)))
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not a JSON line ({error.msg})") from error
    return rows


def mend_torn_end(path: Path) -> int:
    """Make ``path`` end with a whole line, so that what is appended next starts a line of
    its own: a last line without its newline is cut off if it is not JSON (a run killed
    while writing it) or given its newline if it is. Returns the bytes cut (0: none).

    Raises:
        OSError: ``path`` cannot be read or written.
    Costs one read of the file.
    """
    if not path.exists():
        return 0
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1  # what the last newline ends
    torn = data[end:]
    if not torn.strip():
        return 0
    try:
        json.loads(torn)
    except ValueError:
        with path.open("r+b") as handle:
            handle.truncate(end)
        return len(torn)
    with path.open("ab") as handle:  # a whole record that lost its newline
        handle.write(b"\n")
    return 0
