"""Per-call costs of three things a request pays on formline's own paths, each timed against
the way it was done before, in the same run (formline alone: no peer has these policies).

Run from the repository root, alone::

    python -m bench.policy_bench [--repeats 30]

* *distinct items*: ``DistinctItemsMatcher.fill_next_token_bitmask`` inside a free string
  item of a tracked array (``extract``'s verbatim default), against the same mask made by
  its definition, every allowed token's bytes checked (what it did before), on SmolLM2 and
  Llama-3, in a state that refuses nothing and in one that refuses the closing tokens;
* *top-p draw*: ``choose_token`` with ``top_p`` 0.9 over 49,152 allowed logits, against a
  stable sort of every allowed token;
* *grammar hit*: ``Constraint.grammar()`` on a cached schema (meltano.schema), against
  ``schema_to_grammar``, which unpacks the report the caller drops.

Medians in ms; the two sides of each row alternate. Writes ``bench/results/policy.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.core_bench import machine_info, publish
from formline.constraint import Constraint
from formline.mask.bitmask import allocate_token_bitmask
from formline.mask.distinct import DistinctItemsMatcher
from formline.pipeline.decoding import choose_token
from formline.schema import compile_schema, schema_to_grammar
from formline.vocab import Vocabulary
from formline.vocab.fixtures import fixture_path

ROOT = Path(__file__).resolve().parents[1]
TAGS = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}}}}
STATES = {"refuses nothing": '{"tags":["abc","ab', "refuses the closing": '{"tags":["abc","abc'}
MELTANO = ROOT / "tests" / "data" / "maskbench" / "JsonSchemaStore---meltano.schema.json"


def alternated(first: Callable[[], Any], second: Callable[[], Any], repeats: int) -> list[float]:
    """Median ms of ``first`` and ``second``, called in turn ``repeats`` times each."""
    times: list[list[float]] = [[], []]
    for _ in range(repeats):
        for side, call in enumerate((first, second)):
            started = time.perf_counter()
            call()
            times[side].append(time.perf_counter() - started)
    return [1000 * statistics.median(values) for values in times]


def full_scan(matcher: DistinctItemsMatcher, bitmask: np.ndarray) -> None:
    """The policy's mask by its definition: every allowed token's bytes checked."""
    matcher.inner.fill_next_token_bitmask(bitmask)
    array = matcher.follower.item_array()
    assert array is not None
    row = bitmask[0].view(np.uint32)
    flags = np.unpackbits(row.view(np.uint8), bitorder="little")[: matcher._vocabulary_size]
    allowed = np.flatnonzero(flags).tolist()
    choices = matcher._choices.get(array.path)
    pieces = matcher._pieces
    refused = [token for token in allowed if matcher._repeats(pieces[token], array.items, choices)]
    if refused and len(refused) < len(allowed):
        ids = np.asarray(refused, dtype=np.int64)
        np.bitwise_and.at(row, ids >> 5, ~(np.uint32(1) << (ids & 31).astype(np.uint32)))


def distinct_rows(repeats: int) -> list[tuple[str, float, float]]:
    rows = []
    for name in ("smollm2", "llama-bpe"):
        vocabulary = Vocabulary.from_gguf(fixture_path(name))
        compiled = compile_schema(TAGS, vocabulary, disk_cache=False)
        for state, text in STATES.items():
            matcher = DistinctItemsMatcher(compiled.matcher(), {("tags",): None})
            assert matcher.accept_string(text)
            ours, theirs = (
                allocate_token_bitmask(1, vocabulary.size),
                allocate_token_bitmask(1, vocabulary.size),
            )
            matcher.fill_next_token_bitmask(ours)
            full_scan(matcher, theirs)
            assert np.array_equal(ours, theirs), "the policy's mask is not its definition's"
            now, before = alternated(
                lambda m=matcher, b=ours: m.fill_next_token_bitmask(b),
                lambda m=matcher, b=theirs: full_scan(m, b),
                repeats,
            )
            rows.append((f"distinct items, {name}, {state}", before, now))
    return rows


def sorted_draw(logits: np.ndarray, top_p: float, rng: np.random.Generator) -> int:
    """A top-p draw through a stable sort of every allowed token (temperature 1)."""
    ids = np.flatnonzero(np.isfinite(logits))
    probs = np.exp(logits[ids].astype(np.float64) - logits[ids].max())
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    cut = int(np.searchsorted(np.cumsum(probs[order]), top_p)) + 1
    cumulative = np.cumsum(probs[order[:cut]])
    pick = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return int(ids[order[min(pick, cut - 1)]])


def top_p_rows(repeats: int) -> list[tuple[str, float, float]]:
    data = np.random.default_rng(0)
    spread = (data.normal(size=49_152) * 3).astype(np.float32)
    peaked = (data.normal(size=49_152) * 2).astype(np.float32)
    peaked[:5] += np.array([14, 13, 12, 11, 10], dtype=np.float32)
    rows = []
    for shape, logits in (("spread", spread), ("peaked", peaked)):
        ours, theirs = np.random.default_rng(1), np.random.default_rng(1)
        assert choose_token(logits, 1.0, 0.9, ours) == sorted_draw(logits, 0.9, theirs)
        now, before = alternated(
            lambda x=logits, r=ours: choose_token(x, 1.0, 0.9, r),
            lambda x=logits, r=theirs: sorted_draw(x, 0.9, r),
            repeats,
        )
        rows.append((f"top-p 0.9 draw, 49,152 logits, {shape}", before, now))
    return rows


def grammar_rows(repeats: int) -> list[tuple[str, float, float]]:
    schema = json.loads(MELTANO.read_text())["schema"]
    constraint = Constraint.of(schema)
    constraint.grammar()  # the cache holds it now: every call below is a hit
    source = constraint._compiled_schema_source()
    options = constraint._options()
    now, before = alternated(
        constraint.grammar, lambda: schema_to_grammar(source, **options)[0], repeats * 10
    )
    return [("Constraint.grammar() hit, meltano.schema", before, now)]


def markdown(rows: list[tuple[str, float, float]], repeats: int) -> str:
    info = machine_info()
    lines = [
        "# Policy and lookup costs, before and after",
        "",
        f"`python -m bench.policy_bench --repeats {repeats}`; {info.get('cpu_model', '')}, "
        f"{info.get('cpus_usable', '')} cores. Median ms a call, the two sides alternated in "
        "one run (formline alone: no peer has these policies).",
        "",
        "| what | before | now | faster |",
        "|---|---|---|---|",
    ]
    for name, before, now in rows:
        lines.append(f"| {name} | {before:.3f} | {now:.3f} | {before / now:.1f}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "policy.md")
    arguments = parser.parse_args(argv)
    rows = [
        *distinct_rows(arguments.repeats),
        *top_p_rows(arguments.repeats),
        *grammar_rows(arguments.repeats),
    ]
    publish(markdown(rows, arguments.repeats), arguments.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
