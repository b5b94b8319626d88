"""``formline serve``'s process set-up: the startup objects frozen out of the collector."""

from __future__ import annotations

import json
import subprocess
import sys

FROZEN_AFTER_STARTUP = """
import gc, json
from formline.server.app import create_app
from formline.server.cli import build_engine, freeze_startup_objects
app = create_app(build_engine(threads=1))
freeze_startup_objects()
frozen, tracked = gc.get_freeze_count(), len(gc.get_objects())
cycle = [], []
cycle[0].append(cycle[1]); cycle[1].append(cycle[0])
del cycle
print(json.dumps({"frozen": frozen, "tracked": tracked, "collected": gc.collect()}))
"""


def test_serve_freezes_what_startup_made_and_still_collects_new_garbage() -> None:
    # In a child process: a freeze lasts for the whole process, and pytest's must not keep it.
    completed = subprocess.run(
        [sys.executable, "-c", FROZEN_AFTER_STARTUP],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    figures = json.loads(completed.stdout.strip().splitlines()[-1])
    assert figures["frozen"] > 50_000  # the engine's and the libraries' objects
    assert figures["tracked"] < 1_000  # what a full collection still walks
    assert figures["collected"] >= 2  # a cycle made afterwards is still found
