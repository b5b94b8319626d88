#!/usr/bin/env python3
"""Choose the repository's MaskBench sample from a MaskBench folder, by a fixed rule.

The rule (also in tests/data/maskbench/SOURCE.md):

1. A file's subset is its name's prefix: ``<Subset>---<name>.json`` or ``<Subset>_<n>.json``
   (``Github_easy---o1.json`` is ``Github_easy``, ``BFCL_java_5.json`` is ``BFCL_java``).
2. Each subset of ``n`` files gets ``max(min(n, MINIMUM), floor(COUNT * n / total))`` files;
   the slots left up to ``COUNT`` go one each to the subsets with the largest remainders
   ``COUNT * n / total - floor(...)`` (ties by subset name) that still have files left.
3. Within a subset, the files taken are those with the smallest
   ``sha256(SEED + file name)`` (hex digest; ties cannot happen between distinct names).

Usage (from the repository root; the source folder is where new MaskBench versions are
handed over)::

    python3 scripts/sample_maskbench.py SOURCE_DIR [--count 300] [--out tests/data/maskbench]

It replaces the ``*.json`` files of ``--out`` (SOURCE.md and LICENSE stay) and prints the
per-subset table for SOURCE.md.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import re
import shutil
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEED = "formline-maskbench-sample-v1:"
COUNT = 300
MINIMUM = 3


def subset_of(name: str) -> str:
    """The subset of a MaskBench file name (the same rule as ``bench.maskbench.subset_of``)."""
    stem = name.removesuffix(".json")
    if "---" in stem:
        return stem.split("---", 1)[0]
    return re.sub(r"_\d+$", "", stem)


def rank(name: str) -> str:
    """The file's place in its subset's order: the hex SHA-256 of the seed and its name."""
    return hashlib.sha256((SEED + name).encode("utf-8")).hexdigest()


def quotas(sizes: dict[str, int], count: int, minimum: int = MINIMUM) -> dict[str, int]:
    """Files per subset (rule 2). Raises ValueError when ``count`` exceeds the files."""
    total = sum(sizes.values())
    if count > total:
        raise ValueError(f"asked for {count} files of {total}")
    shares = {subset: count * size / total for subset, size in sizes.items()}
    chosen = {
        subset: max(min(sizes[subset], minimum), math.floor(share))
        for subset, share in shares.items()
    }
    by_remainder = sorted(shares, key=lambda subset: (-(shares[subset] % 1), subset))
    while sum(chosen.values()) < count:
        for subset in by_remainder:
            if sum(chosen.values()) < count and chosen[subset] < sizes[subset]:
                chosen[subset] += 1
    if sum(chosen.values()) > count:
        raise ValueError(f"the minimum of {minimum} per subset needs more than {count} files")
    return chosen


def select(names: list[str], count: int = COUNT) -> list[str]:
    """The sample's file names, sorted (rules 1 to 3)."""
    groups: dict[str, list[str]] = defaultdict(list)
    for name in names:
        groups[subset_of(name)].append(name)
    wanted = quotas({subset: len(group) for subset, group in groups.items()}, count)
    chosen = [
        name
        for subset, group in groups.items()
        for name in sorted(group, key=rank)[: wanted[subset]]
    ]
    return sorted(chosen)


def table(names: list[str], chosen: list[str]) -> str:
    """The Markdown table of files per subset: in the source, in the sample."""
    total: dict[str, int] = defaultdict(int)
    kept: dict[str, int] = defaultdict(int)
    for name in names:
        total[subset_of(name)] += 1
    for name in chosen:
        kept[subset_of(name)] += 1
    lines = ["| subset | files | sampled |", "|---|---:|---:|"]
    lines += [f"| {subset} | {total[subset]} | {kept[subset]} |" for subset in sorted(total)]
    lines.append(f"| **all** | {len(names)} | {len(chosen)} |")
    return "\n".join(lines)


def main(arguments: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="a folder of MaskBench *.json files")
    parser.add_argument("--count", type=int, default=COUNT)
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "maskbench")
    options = parser.parse_args(arguments)
    names = sorted(path.name for path in options.source.glob("*.json"))
    if not names:
        parser.error(f"no *.json files in {options.source}")
    chosen = select(names, options.count)
    options.out.mkdir(parents=True, exist_ok=True)
    for old in options.out.glob("*.json"):
        old.unlink()
    for name in chosen:
        shutil.copyfile(options.source / name, options.out / name)
    size = sum((options.out / name).stat().st_size for name in chosen)
    print(table(names, chosen))
    print(f"\n{len(chosen)} files, {size / 1e6:.2f} MB, in {options.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
