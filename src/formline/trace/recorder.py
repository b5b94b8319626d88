"""Record what the mask did on a real model, for the trace page (:mod:`formline.trace.html`).

:func:`record_trace` runs the request several ways on one backend and returns a JSON-ready
dict: free samples at a temperature (the problem; prompt-only), JSON-object-mode samples
and schema-constrained samples (in practice), one constrained greedy generation recorded
step by step (logit masking, the automaton state, token boundaries, mask vs forward time),
the per-field pressure, and the same request with its evidence (free-text) fields first and
last (an ``evidence`` field is added where the schema has none).

The step-by-step run is formline's one decoding loop
(:func:`formline.pipeline.decoding.decode`) with a :class:`StepRecorder` listening, greedy,
without jump-forward or closing (so every output token is one recorded step); it stops on
a stop token, the grammar's end or ``max_tokens``.
"""

from __future__ import annotations

import json
import time
from functools import partial
from typing import Any, NamedTuple

import numpy as np
from tqdm import tqdm

from formline.backends.base import Backend, load_backend
from formline.constraint import schema_description
from formline.evaluation.variants import is_evidence_field, reorder_properties
from formline.grammar import GrammarError
from formline.mask.matcher import GrammarMatcher
from formline.pipeline.decoding import Sampling, decode
from formline.pipeline.generate import Shaping, generate
from formline.pipeline.listeners import StepListener
from formline.pipeline.pressure import DEFAULT_THRESHOLD, field_pressure
from formline.schema import SchemaError, compile_schema

TOP_K = 5
EXAMPLES = 8  # allowed tokens of 2+ bytes shown per step, with their byte walks
STRUCTURAL = frozenset(b'"{}[],:')  # JSON's punctuation: a token holding it crosses symbols
EVIDENCE_FIELD = {
    "type": "string",
    "maxLength": 160,
    "description": "The words of the text that support the answer, quoted.",
}
FAILURE_REASONS = (
    "text before the JSON",
    "wrong type",
    "missing field",
    "stopped early",
    "syntax error",
    "other schema error",
)


def load_trace_backend(model: str | None = None, n_threads: int = 1) -> Backend:
    """The llama.cpp backend on ``model`` (``None``: the embedded SmolLM2), one thread."""
    return load_backend("llama_cpp", model, n_threads=n_threads)


def record_trace(
    schema: dict[str, Any],
    prompt: str,
    backend: Backend,
    *,
    free_samples: int = 8,
    temperature: float = 0.8,
    max_tokens: int = 96,
    seed: int = 0,
    field_orders: bool = True,
    progress: bool = False,
) -> dict[str, Any]:
    """Record one trace of ``prompt`` under ``schema`` on ``backend`` (llama.cpp).
    ``progress``: a tqdm bar on stderr, one tick per generation.

    Costs 3 x ``free_samples`` sampled generations, one recorded greedy generation (one
    forward pass per token) and, with ``field_orders``, two more greedy generations (on
    two cores and the embedded model, about a minute with the defaults). A field order
    variant that does not compile (the added ``evidence`` field under ``maxProperties``
    or ``propertyNames``) skips the comparison: ``field_orders`` is ``None`` and
    ``field_orders_note`` says why.

    Raises:
        SchemaError, GrammarError: ``schema`` itself does not compile (before any run).
    """
    vocabulary = backend.vocabulary
    compiled = compile_schema(schema, vocabulary)
    # The order variants compile now, not after the minutes of recording: the added field
    # can make a schema unsatisfiable, and that failure lost the whole recording.
    orders = _order_variants(schema, vocabulary) if field_orders else None
    described = f"{prompt}\n\n{schema_description(schema)}"
    total = 3 * free_samples + 1 + (2 if field_orders else 0)
    bar = tqdm(total=total, disable=not progress, unit="run", desc="trace")
    sampled = partial(
        _samples, backend, described, compiled=compiled, count=free_samples, bar=bar,
        temperature=temperature, max_tokens=max_tokens, seed=seed,
    )  # fmt: skip
    samples = {
        "prompt_only": sampled(output=None),
        "json_mode": sampled(output={"type": "object"}),
        "schema": sampled(output=schema),
    }
    steps_run = _record_steps(
        backend, described, GrammarMatcher(compiled.compiled_grammar), max_tokens
    )
    bar.update()
    trace: dict[str, Any] = {
        "version": 1,
        "model": getattr(backend, "model_path", None) and str(backend.model_path.name),  # type: ignore[attr-defined]
        "prompt": prompt,
        "schema": schema,
        "vocabulary_size": vocabulary.size,
        "temperature": temperature,
        "free_samples": free_samples,
        "max_tokens": max_tokens,
        "samples": samples,
        "failure_reasons": list(FAILURE_REASONS),
        "constrained": steps_run,
        "pressure_threshold": DEFAULT_THRESHOLD,
        "field_orders": _field_orders(backend, prompt, orders, max_tokens, bar)
        if orders is not None
        else None,
        "field_orders_note": orders.note if orders is not None else None,
    }
    bar.close()
    return trace


def _samples(
    backend: Backend,
    prompt: str,
    *,
    output: Any,
    compiled: Any,
    count: int,
    temperature: float,
    max_tokens: int,
    seed: int,
    bar: tqdm,
) -> list[dict[str, Any]]:
    """``count`` sampled generations, each classified against the real schema."""
    rows = []
    for index in range(count):
        result = generate(
            prompt,
            output,
            backend,
            temperature=temperature,
            seed=seed + index,
            max_tokens=max_tokens,
            describe_schema=False,
        )
        reason, json_ok = classify(result.text, result.finish_reason, compiled.check)
        rows.append(
            {
                "text": result.text,
                "finish": result.finish_reason,
                "json_valid": json_ok,
                "valid": reason is None,
                "reason": reason,
                "tokens": result.usage["completion_tokens"],
            }
        )
        bar.update()
    return rows


def classify(text: str, finish: str, check: Any) -> tuple[str | None, bool]:
    """The failure reason of one reply (``None``: valid) and whether it parsed as JSON."""
    stripped = text.strip()
    try:
        instance = json.loads(stripped)
    # ValueError holds JSONDecodeError and an integer past Python's digit limit; a reply of
    # thousands of nested brackets runs out of recursion. Each is a reply that failed.
    except (ValueError, RecursionError):
        if stripped and stripped[0] not in "{[" and ("{" in stripped or "[" in stripped):
            return "text before the JSON", False
        if finish == "length" or not stripped:
            return "stopped early", False
        return "syntax error", False
    errors = check(instance)
    if not errors:
        return None, True
    joined = " ".join(errors)
    if "is not of type" in joined:
        return "wrong type", True
    if "required property" in joined:
        return "missing field", True
    return "other schema error", True


def _show(piece: bytes) -> str:
    """A token's text; the bytes of a character it holds only part of as ``\\xNN`` (each
    part of a split character read as U+FFFD, so the page disagreed with the run)."""
    return piece.decode("utf-8", errors="backslashreplace")


def _softmax(logits: np.ndarray) -> np.ndarray:
    finite = np.isfinite(logits)
    peak = float(logits[finite].max())
    values = np.where(finite, np.exp(np.where(finite, logits, peak) - peak), 0.0)
    return values / values.sum()


def _top(probabilities: np.ndarray, pieces: Any, eos: frozenset[int]) -> list[list[Any]]:
    """The ``TOP_K`` most probable tokens with a probability above zero: [text, id, p]."""
    ids = np.argpartition(-probabilities, TOP_K)[:TOP_K]
    ids = ids[np.argsort(-probabilities[ids], kind="stable")]
    return [
        ["<eos>" if int(i) in eos else _show(pieces[int(i)]), int(i), float(probabilities[i])]
        for i in ids
        if probabilities[i] > 0
    ]


def byte_ranges(values: list[int]) -> str:
    """``[48..57, 45]`` as ``-  0-9``: printable bytes shown, ranges of 3+ joined."""
    parts: list[str] = []
    index = 0
    while index < len(values):
        end = index
        while end + 1 < len(values) and values[end + 1] == values[end] + 1:
            end += 1
        first, last = values[index], values[end]
        if end - index >= 2:
            parts.append(f"{_byte_text(first)}-{_byte_text(last)}")
        else:
            parts.extend(_byte_text(value) for value in values[index : end + 1])
        index = end + 1
    return " ".join(parts)


def _byte_text(value: int) -> str:
    if value == 0x20:
        return "␣"
    if 0x20 < value < 0x7F:
        return chr(value)
    return {0x0A: "\\n", 0x09: "\\t", 0x0D: "\\r"}.get(value, f"\\x{value:02x}")


def _crossing(matcher: GrammarMatcher, piece: bytes) -> list[dict[str, Any]]:
    """How one token's bytes walk the automaton: per byte, the bytes allowed there."""
    stacks = matcher.state_key()[0]
    walk = []
    for byte in piece:
        allowed = _live_bytes_of(matcher, stacks)
        walk.append({"byte": _byte_text(byte), "allowed": len(allowed)})
        result = matcher.compiled.advance_bytes(stacks, bytes((byte,)))
        if result is None:
            break
        stacks = result[0]
    return walk


def _examples(
    matcher: GrammarMatcher,
    allowed: np.ndarray,
    lengths: np.ndarray,
    punctuation: np.ndarray,
    pieces: Any,
) -> list[dict[str, Any]]:
    """Up to EXAMPLES ``allowed`` tokens of two or more bytes, each with its byte walk: those
    holding the most JSON punctuation first (seed 003's ``": "`` crosses a quote, a colon
    and a space), then by length and id; inside a string, where no punctuation is allowed,
    the longest. Costs vectorised passes over the vocabulary plus 8 walks (a few ms)."""
    ids = np.flatnonzero(allowed[: lengths.shape[0]] & (lengths >= 2))
    order = ids[np.lexsort((ids, -lengths[ids], -punctuation[ids]))]
    if order.size and punctuation[order[0]] > 0:  # shortest first among the richest
        order = ids[np.lexsort((ids, lengths[ids], -punctuation[ids]))]
    order = order[:EXAMPLES]
    return [
        {"token": _show(pieces[int(i)]), "id": int(i), "walk": _crossing(matcher, pieces[int(i)])}
        for i in order
    ]


def _live_bytes_of(matcher: GrammarMatcher, stacks: Any) -> list[int]:
    live = matcher.compiled.live_bytes
    candidates = sorted({byte for stack in stacks for byte in live[stack[-1]]})
    step = matcher.compiled.advance_bytes
    return [byte for byte in candidates if step(stacks, bytes((byte,))) is not None]


class StepRecorder(StepListener):
    """Records every step of a constrained greedy loop for the trace page: the top tokens
    before and after the mask, what the mask removed, the automaton state, the token's
    byte walk and examples of allowed multi-byte tokens, mask and forward times. Costs two
    softmaxes, a few vectorised passes over the vocabulary and a few walks per step."""

    def __init__(self, vocabulary: Any):
        self.pieces = pieces = vocabulary.token_bytes
        self.eos = frozenset(vocabulary.eos_ids)
        size = vocabulary.size
        self.is_text = np.ones(size, dtype=bool)  # not a stop or special token
        self.is_text[[i for i in self.eos | frozenset(vocabulary.special_ids) if i < size]] = False
        self.lengths = np.array([len(piece) for piece in pieces])
        # once per run: the JSON punctuation bytes in each token
        self.punctuation = np.array([sum(b in STRUCTURAL for b in piece) for piece in pieces])
        self.states: dict[Any, int] = {}
        self.steps: list[dict[str, Any]] = []
        self.started = time.perf_counter()
        self._step: dict[str, Any] = {}
        self._begun = 0.0

    def on_logits(
        self, position: int, logits: np.ndarray, matcher: Any, forward_seconds: float
    ) -> None:
        key = matcher.state_key()
        self._step = {
            "index": len(self.steps),
            "before": _top(_softmax(logits), self.pieces, self.eos),
            "state": self.states.setdefault(key, len(self.states)),
            "stacks": len(key[0]),
            "live": _live_bytes_of(matcher, key[0]),
            "forward_ms": forward_seconds * 1000,
        }
        self._begun = time.perf_counter()

    def on_masked(self, position: int, logits: np.ndarray, bitmask_row: np.ndarray) -> None:
        self._step["mask_ms"] = (time.perf_counter() - self._begun) * 1000
        self._step["after_probabilities"] = _softmax(logits)
        size = self.lengths.shape[0]
        allowed = np.unpackbits(bitmask_row.view(np.uint8), bitorder="little")[:size]
        self._step["allowed_flags"] = allowed.astype(bool)

    def on_token(self, position: int, token: int, matcher: Any) -> None:
        step, pieces, eos = self._step, self.pieces, self.eos
        after, allowed = step.pop("after_probabilities"), step.pop("allowed_flags")
        live = step.pop("live")
        is_eos, piece = token in eos, pieces[token]
        self.steps.append(
            {
                **step,
                "after": _top(after, pieces, eos),
                "chosen": "<eos>" if is_eos else _show(piece),
                "chosen_bytes": "" if is_eos else piece.hex(),  # the page decodes the run
                "chosen_id": token,
                "chosen_p": float(after[token]),
                "allowed": int(allowed.sum()),
                "allowed_multi": int((allowed & (self.lengths >= 2)).sum()),
                "can_end": matcher.can_end(),
                "live_bytes": byte_ranges(live),
                "live_count": len(live),
                "crossing": [] if is_eos else _crossing(matcher, piece),
                "examples": _examples(
                    matcher, allowed & self.is_text, self.lengths, self.punctuation, pieces
                ),
            }
        )


def _record_steps(
    backend: Backend, prompt: str, matcher: GrammarMatcher, max_tokens: int
) -> dict[str, Any]:
    """One constrained greedy generation through the decoding loop, every step recorded
    (no jump-forward and no closing, so every output token is one recorded step)."""
    recorder = StepRecorder(backend.vocabulary)
    sampling = Sampling(max_tokens=max_tokens, jump_forward=False, close_within_budget=False)
    rendered = backend.render_chat([{"role": "user", "content": prompt}])
    generation = decode(backend, rendered, matcher, sampling, [recorder])
    pieces = backend.vocabulary.token_bytes
    for step in recorder.steps:  # the pressure listener's figures, for the page
        removed, refused, preferred = generation.step_pressure[step["index"]]
        preferred_text = "<eos>" if preferred in recorder.eos else _show(pieces[preferred])
        step.update(removed=removed, refused=refused, preferred=preferred_text)
    fields = field_pressure(generation.token_ids, pieces, generation.step_pressure)
    return {
        "text": generation.text,
        "finish": generation.finish_reason,
        "prompt_tokens": generation.prompt_tokens,
        "states_seen": len(recorder.states),
        "total_ms": (time.perf_counter() - recorder.started) * 1000,
        "steps": recorder.steps,
        "pressure": [_pressure_row(entry) for entry in fields.values()],
    }


def _pressure_row(entry: Any) -> dict[str, Any]:
    return {
        "path": entry.path or "(top level)",
        "steps": entry.steps,
        "max_removed": entry.max_removed,
        "mean_removed": entry.mean_removed,
        "refused": entry.preferred_refused,
        "flagged": entry.is_flagged(),
    }


class OrderVariants(NamedTuple):
    """The field order comparison's schemas, compiled once before any recording."""

    variants: list[tuple[str, dict[str, Any]]]  # (label, schema): evidence-first, answer-first
    added: str | None  # the name of the added evidence field, if one was added
    note: str | None  # why there is no comparison (then ``variants`` is empty)


def _order_variants(schema: dict[str, Any], vocabulary: Any) -> OrderVariants:
    """The same schema evidence-first and answer-first: its free-text fields
    (:func:`~formline.evaluation.variants.is_evidence_field`) before, then after, the
    answers; an ``evidence`` field is added to an object schema that has none. Each variant
    is compiled as :func:`~formline.pipeline.generate.generate` compiles it (cached, so the
    runs do not compile again); one that does not compile leaves no variants and a note.
    Costs two compiles."""
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(properties, dict) or not properties:
        return OrderVariants([], None, "needs an object schema with properties")
    added = None
    if not any(is_evidence_field(name, sub) for name, sub in properties.items()):
        # A name the schema does not use: its own non-text "evidence" was replaced.
        added = next(
            name
            for name in ("evidence", *(f"evidence_{k}" for k in range(1, len(properties) + 2)))
            if name not in properties
        )
        schema = {**schema, "properties": {**properties, added: EVIDENCE_FIELD}}
        schema["required"] = [*schema.get("required", []), added]
    variants = []
    for label, evidence_first in (("evidence-first", True), ("answer-first", False)):
        variant = reorder_properties(schema, evidence_first=evidence_first)
        try:
            Shaping().constraint(variant)[0].compile(vocabulary)
        except (SchemaError, GrammarError) as error:
            reason = f'with the added "{added}" field ' if added else ""
            return OrderVariants([], added, f"the {label} schema {reason}does not compile: {error}")
        variants.append((label, variant))
    return OrderVariants(variants, added, None)


def _field_orders(
    backend: Backend, prompt: str, orders: OrderVariants, max_tokens: int, bar: tqdm
) -> dict[str, Any] | None:
    """The same request, greedy, under each of ``orders``' variants (see
    :func:`_order_variants`); ``None`` when there are none."""
    if not orders.variants:
        bar.update(2)
        return None
    rows = []
    for label, variant in orders.variants:
        result = generate(prompt, variant, backend, temperature=0.0, max_tokens=max_tokens)
        rows.append(
            {
                "label": label,
                "order": list(variant["properties"]),
                "text": result.text,
                "finish": result.finish_reason,
                "valid": result.finish_reason == "stop" and not result.errors,
                "flagged": result.flagged_fields(),
                "max_removed": max(
                    (entry.max_removed for entry in result.pressure.values()), default=0.0
                ),
                "mask_ms": result.timings["mask_seconds"] * 1000,
                "forward_ms": result.timings["forward_seconds"] * 1000,
            }
        )
        bar.update()
    return {"rows": rows, "added_field": orders.added}
