"""Plots of a saved run (matplotlib, Agg backend: PNG files, no display needed).

Three figures from ``results.json`` alone: validity and accuracy per variant, latency per
token (forward and mask), and per-field accuracy (a variant x field heat map).
matplotlib is an optional dependency: ``pip install 'formline[eval]'``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

VALIDITY_BARS = (
    ("parses (strict)", "strict_parse"),
    ("parses (fences stripped)", "lenient_parse"),
    ("validates", "valid"),
    ("fields correct", "fields_correct"),
)
PLOT_FILES = ("validity_accuracy.png", "latency.png", "field_accuracy.png")


def _pyplot() -> Any:
    try:
        import matplotlib
    except ModuleNotFoundError as error:
        raise ValueError("plots need matplotlib: pip install 'formline[eval]'") from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_all(results: dict[str, Any], directory: Path) -> list[Path]:
    """Draw the three PNG files under ``directory``; returns their paths.

    Raises ValueError when matplotlib is not installed."""
    plt = _pyplot()
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / name for name in PLOT_FILES]
    for draw, path in zip((_validity, _latency, _fields), paths, strict=True):
        figure = draw(plt, results["variants"])
        figure.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(figure)
    return paths


def _all_correct(summary: dict[str, Any]) -> float:
    return float(summary["all_fields_correct"]["overall"]["accuracy"] or 0.0)


def _validity(plt: Any, variants: dict[str, Any]) -> Any:
    names = list(variants)
    bars = [*VALIDITY_BARS, ("all fields correct", None)]
    figure, axes = plt.subplots(figsize=(max(7.0, 1.6 * len(names)), 4.2))
    width = 0.8 / len(bars)
    for index, (label, key) in enumerate(bars):
        values = [
            _all_correct(variants[name]) if key is None else variants[name][key] or 0.0
            for name in names
        ]
        positions = [slot + (index - len(bars) / 2 + 0.5) * width for slot in range(len(names))]
        axes.bar(positions, [100 * value for value in values], width, label=label)
    axes.set_xticks(range(len(names)), names, rotation=20, ha="right")
    axes.set_ylabel("% of tasks (fields correct: % of scored fields)")
    axes.set_ylim(0, 105)
    axes.set_title("Validity and accuracy per variant")
    axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return figure


def _latency(plt: Any, variants: dict[str, Any]) -> Any:
    names = list(variants)
    mask = [variants[name].get("mask_ms_per_token") or 0.0 for name in names]
    decode = [variants[name].get("decode_ms_per_token") for name in names]
    wall = [variants[name].get("ms_per_token") or 0.0 for name in names]
    forward = [(total or 0.0) - extra for total, extra in zip(decode, mask, strict=True)]
    figure, axes = plt.subplots(figsize=(max(7.0, 1.4 * len(names)), 4.0))
    slots = list(range(len(names)))
    axes.bar([s - 0.2 for s in slots], forward, 0.4, label="forward (decoding loop)")
    axes.bar([s - 0.2 for s in slots], mask, 0.4, bottom=forward, label="mask")
    axes.bar([s + 0.2 for s in slots], wall, 0.4, label="wall (whole task)", color="0.7")
    axes.set_xticks(slots, names, rotation=20, ha="right")
    axes.set_ylabel("ms per generated token")
    axes.set_title("Latency per token (repair: wall only)")
    axes.legend(fontsize=8)
    return figure


def _fields(plt: Any, variants: dict[str, Any]) -> Any:
    names = list(variants)
    fields: dict[str, None] = {}
    for summary in variants.values():
        fields.update(dict.fromkeys(summary["field_accuracy"]))
    grid = [
        [
            100 * (variants[name]["field_accuracy"].get(field, {}).get("accuracy") or 0.0)
            for name in names
        ]
        for field in fields
    ]
    figure, axes = plt.subplots(figsize=(2.0 + 1.3 * len(names), 0.9 + 0.32 * len(fields)))
    image = axes.imshow(grid, cmap="RdYlGn", vmin=0, vmax=100, aspect="auto")
    for row, values in enumerate(grid):
        for column, value in enumerate(values):
            axes.text(column, row, f"{value:.0f}", ha="center", va="center", fontsize=7)
    axes.set_xticks(range(len(names)), names, rotation=20, ha="right")
    axes.set_yticks(range(len(fields)), list(fields), fontsize=8)
    axes.set_title("Per-field accuracy (%)")
    figure.colorbar(image, ax=axes, fraction=0.04)
    return figure
