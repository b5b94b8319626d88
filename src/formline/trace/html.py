"""The trace page: one self-contained HTML file (inline CSS and JS, the trace embedded).

The template ``page.html`` (package data) holds the six-step explainer; the trace goes into
its ``<script type="application/json" id="trace-data">`` tag. Nothing is loaded from the
network.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import tempfile
from pathlib import Path
from typing import Any

PLACEHOLDER = "__TRACE_JSON__"


def render_trace_html(trace: dict[str, Any]) -> str:
    """The page for ``trace`` (from :func:`formline.trace.record_trace`).

    ``<`` is written as ``\\u003c`` in the embedded JSON, so model text such as
    ``</script>`` cannot end the data tag.
    """
    template = importlib.resources.files("formline.trace").joinpath("page.html")
    page = template.read_text(encoding="utf-8")
    data = json.dumps(trace, ensure_ascii=False, allow_nan=False).replace("<", "\\u003c")
    return page.replace(PLACEHOLDER, data, 1)


def write_trace_html(trace: dict[str, Any], path: str | Path) -> Path:
    """Write the page for ``trace`` to ``path`` and return ``path``: whole or not at all (a
    temporary file beside it, renamed), so a failed write leaves an earlier page as it was.
    A symbolic link is followed: the file it names gets the page, the link stays.

    Raises:
        OSError: the folder cannot be written.
    """
    # Resolved once, for both the temporary file and the rename: a symbolic link's folder
    # may be on another device (os.replace failed) and the link itself was replaced by the
    # page while the file it named kept the old one.
    target = Path(path).resolve()
    page = render_trace_html(trace)
    handle, partial = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as sink:
            sink.write(page)
        os.chmod(partial, 0o644)  # mkstemp's file is the owner's alone; a page is to share
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)  # a failed write leaves nothing behind
    return Path(path)
