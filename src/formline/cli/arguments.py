"""argparse types the commands share: numbers refused out of range as usage errors (exit 2,
naming the flag) before any model loads."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def at_least(lowest: float, kind: type) -> Callable[[str], Any]:
    """An argparse type: ``kind`` of the text, refused under ``lowest`` (``--max-tokens 0``
    ran, and ``formline eval`` reported every rate as 0%)."""

    def read(text: str) -> Any:
        value = kind(text)
        if value < lowest:
            raise argparse.ArgumentTypeError(f"must be at least {lowest}, got {text}")
        return value

    read.__name__ = kind.__name__  # argparse names the type in its "invalid ..." message
    return read


def probability(text: str) -> float:
    """An argparse type for ``--top-p``: a float in (0, 1]."""
    value = float(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value
