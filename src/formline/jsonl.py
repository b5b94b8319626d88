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
    return read_numbered_text(path, path.read_bytes())


def read_numbered_text(path: Path, data: bytes) -> list[tuple[int, Any]]:
    """:func:`read_numbered` of ``data``, the bytes of ``path`` (named in errors).

    Raises:
        ValueError: ``path:line`` of a line that is not JSON (or not UTF-8).
    """
    rows = []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text ({error.reason})") from error
    # Split on newlines only: str.splitlines also splits at U+2028 inside a JSON string.
    for number, line in enumerate(text.split("\n"), 1):
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
        ValueError: a line before the torn one is not JSON (the file is no JSON Lines file:
            nothing is cut).
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
        read_numbered_text(path, data[:end])  # not JSON Lines at all: raise, cut nothing
        with path.open("r+b") as handle:
            handle.truncate(end)
        return len(torn)
    with path.open("ab") as handle:  # a whole record that lost its newline
        handle.write(b"\n")
    return 0
