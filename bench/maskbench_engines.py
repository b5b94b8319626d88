"""MaskBench engine adapters and the worker process that runs one engine on one vocabulary.

The adapters extend bench.core_bench's engines (vocabulary preparation, matcher, bitmask, fill,
accept and error handling are theirs) with a JSON-schema compile, the engine's documented
"unsupported schema" errors and, for formline, the after-check. A worker (``worker_main``) is a
separate process so that the parent can kill it when a schema runs past its time limit.
"""

from __future__ import annotations

import gc
import json
import os
import re
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from typing import Any, ClassVar

from bench.core_bench import (
    Engine,
    FormlineEngine,
    LLGuidanceEngine,
    VocabularyContext,
    XGrammarEngine,
    load_tokenizer,
)

MESSAGE_LIMIT = 300


def short(text: object) -> str:
    """One line of at most MESSAGE_LIMIT characters."""
    line = " ".join(str(text).split())
    return line if len(line) <= MESSAGE_LIMIT else line[: MESSAGE_LIMIT - 3] + "..."


_stderr_sink: Any = None


def capture_stderr() -> None:
    """Send this process's fd 2 (where XGrammar's C++ logs its warnings) to a temporary file."""
    global _stderr_sink
    _stderr_sink = tempfile.TemporaryFile(buffering=0)  # noqa: SIM115 (lives with the worker)
    os.dup2(_stderr_sink.fileno(), 2)


def take_warnings() -> list[str]:
    """Distinct lines written to fd 2 since the last call (timestamps and paths cut)."""
    if _stderr_sink is None:
        return []
    sys.stderr.flush()
    _stderr_sink.seek(0)
    text = _stderr_sink.read().decode("utf-8", "replace")
    _stderr_sink.seek(0)
    _stderr_sink.truncate()
    lines = [re.sub(r"^\[[\d:]+\] \S+: ", "", line).strip() for line in text.splitlines()]
    return [short(line) for line in dict.fromkeys(lines) if line][:10]


class UnsupportedSchemaError(Exception):
    """The engine declined the schema with its documented error (not a crash)."""


class SchemaEngine(Engine):
    """What MaskBench needs on top of core_bench's Engine."""

    options: ClassVar[dict[str, Any]] = {}

    def compile_schema(self, schema: Any) -> Any:
        """Compile (timed). Raises UnsupportedSchemaError for documented schema errors."""
        raise NotImplementedError

    def new_matcher(self, compiled: Any) -> Any:
        return self.matcher(compiled)

    def after_check(self, compiled: Any, data: Any) -> list[str] | None:
        """Errors of the engine's after-check, or None when the engine has none."""
        return None

    def compile_details(self, compiled: Any) -> dict[str, Any]:
        return {}

    def warnings(self, compiled: Any) -> list[str]:
        """Warnings the engine gives through its API (fd 2 is captured separately)."""
        return []


class FormlineSchemaEngine(FormlineEngine, SchemaEngine):
    options: ClassVar[dict[str, Any]] = {
        "disk_cache": False,
        "memory_cache": "cleared before each schema",
    }

    def __init__(self) -> None:
        super().__init__()
        from formline.grammar import GrammarError
        from formline.schema import SchemaError

        self.declined = (SchemaError, GrammarError)

    def compile_schema(self, schema: Any) -> Any:
        try:
            return self.compiler.compile_json_schema(schema)
        except self.declined as error:
            raise UnsupportedSchemaError(f"{type(error).__name__}: {error}") from error

    def new_matcher(self, compiled: Any) -> Any:
        return self.mask.GrammarMatcher(compiled.compiled_grammar)

    def after_check(self, compiled: Any, data: Any) -> list[str] | None:
        return list(compiled.check(data))

    def compile_details(self, compiled: Any) -> dict[str, Any]:
        report = compiled.report
        return {
            "enforced": len(getattr(report, "enforced", ())),
            "checked_after": [short(use) for use in getattr(report, "checked_after", ())][:10],
            "unsupported": [short(use) for use in getattr(report, "unsupported", ())][:10],
        }


class XGrammarSchemaEngine(XGrammarEngine, SchemaEngine):
    options: ClassVar[dict[str, Any]] = {
        "any_whitespace": False,
        "separators": [",", ":"],
        "strict_mode": True,
        "max_threads": 1,
        "cache_enabled": False,
    }

    def compile_schema(self, schema: Any) -> Any:
        try:
            return self.compiler.compile_json_schema(
                json.dumps(schema), any_whitespace=False, separators=(",", ":"), strict_mode=True
            )
        except RuntimeError as error:  # xgrammar's C++ errors: invalid or unsupported schema
            raise UnsupportedSchemaError(f"{type(error).__name__}: {error}") from error


class LLGuidanceSchemaEngine(LLGuidanceEngine, SchemaEngine):
    options: ClassVar[dict[str, Any]] = {
        "whitespace_flexible": False,
        "item_separator": ",",
        "key_separator": ":",
    }

    def prepare(self, context: VocabularyContext) -> None:
        # The transformers tokenizer of a GGUF file can have more ids than the GGUF vocabulary
        # (llama-bpe: 128,257 with an added <|endoftext|>); llguidance refuses a smaller n_vocab.
        self.size = max(context.size, len(context.tokenizer))
        self.tokenizer = self.llg.hf.from_tokenizer(
            context.tokenizer, n_vocab=self.size, eos_token=context.eos_id
        )

    def allocate(self, context: VocabularyContext) -> Any:
        return self.allocate_numpy(1, self.size)

    def compile_schema(self, schema: Any) -> Any:
        try:
            grammar = self.llg.LLMatcher.grammar_from_json_schema(schema, defaults=self.options)
        except ValueError as error:  # documented: not a JSON object
            raise UnsupportedSchemaError(f"{type(error).__name__}: {error}") from error
        matcher = self.llg.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():  # documented: the constructor never raises, errors are a state
            raise UnsupportedSchemaError(matcher.get_error())
        return matcher

    def new_matcher(self, compiled: Any) -> Any:
        return compiled.deep_copy()

    def warnings(self, compiled: Any) -> list[str]:
        return [short(text) for text in compiled.get_grammar_warnings()][:10]


ENGINES: dict[str, type[SchemaEngine]] = {
    "formline": FormlineSchemaEngine,
    "llguidance": LLGuidanceSchemaEngine,
    "xgrammar": XGrammarSchemaEngine,
}


def walk(
    engine: SchemaEngine,
    matcher: Any,
    bitmask: Any,
    tokens: list[int],
    eos_id: int,
    masks: list[int] | None,
    accepts: list[int] | None,
    mismatches: list[str],
) -> str:
    """Walk ``tokens`` then EOS with a fill before every step; "" if all accepted, else why not.

    Fill and accept times go to ``masks`` / ``accepts`` when given. The mask is the authority,
    as in MaskBench's own harness: a token outside it ends the walk even if accept would take
    it. A token whose mask bit disagrees with accept's answer goes to ``mismatches`` as
    "stricter" (mask refuses, accept takes: llguidance does this on purpose where the forced
    text has a canonical tokenization) or "unsound" (mask allows, accept refuses).
    """
    for position, token_id in enumerate([*tokens, eos_id]):
        label = "EOS" if position == len(tokens) else f"token #{position} id {token_id}"
        before = time.perf_counter_ns()
        engine.fill(matcher, bitmask)
        filled = time.perf_counter_ns()
        in_mask = engine.allowed(bitmask, token_id)
        accepted_at = time.perf_counter_ns()
        accepted = engine.accept(matcher, token_id)
        done = time.perf_counter_ns()
        if masks is not None and accepts is not None:
            masks.append(filled - before)
            accepts.append(done - accepted_at)
        if in_mask != accepted:
            kind = "unsound: in the mask, refused" if in_mask else "stricter: accepted, not in mask"
            mismatches.append(f"{kind}: {label}")
        if not in_mask:
            return f"{label} not in the mask" + (" (accept would take it)" if accepted else "")
        if not accepted:
            detail = engine.error(matcher)
            return f"{label} refused" + (f": {short(detail)}" if detail else "")
    return ""


def run_schema(
    engine: SchemaEngine, context: VocabularyContext, job: dict[str, Any], conn: Connection
) -> dict[str, Any]:
    """Compile one schema (telling ``conn`` when it starts and has its first mask), walk it."""
    result: dict[str, Any] = {"status": "compiled"}
    engine.reset_caches(context)
    bitmask = engine.allocate(context)
    take_warnings()
    gc.collect()
    gc.disable()
    conn.send(("started", None))  # the parent's compile clock starts here, after the cleanup
    try:
        started = time.perf_counter_ns()
        try:
            compiled = engine.compile_schema(job["schema"])
        except UnsupportedSchemaError as error:
            result.update(status="unsupported", error=short(error))
            return result
        compiled_at = time.perf_counter_ns()
        engine.fill(engine.new_matcher(compiled), bitmask)
        first_mask = time.perf_counter_ns()
        result["warnings"] = take_warnings() + engine.warnings(compiled)
        result["ttfm_ms"] = (first_mask - started) / 1e6
        result["compile_ms"] = (compiled_at - started) / 1e6
        result["details"] = engine.compile_details(compiled)
        conn.send(("compiled", result))
        counts = dict.fromkeys(("valid", "invalid", "invalid_refused", "invalid_caught"), 0)
        lists: dict[str, list[Any]] = {
            name: []
            for name in ("valid_refused", "valid_flagged", "invalid_accepted", "mismatches")
        }
        masks: list[int] = []
        accepts: list[int] = []
        for index, instance in enumerate(job["instances"]):
            valid = instance["valid"]
            counts["valid" if valid else "invalid"] += 1
            mismatches: list[str] = []
            refusal = walk(
                engine,
                engine.new_matcher(compiled),
                bitmask,
                instance["tokens"],
                job["eos_id"],
                masks if valid else None,
                accepts if valid else None,
                mismatches,
            )
            lists["mismatches"] += [f"{text} (test #{index})" for text in mismatches]
            checked = None if refusal else engine.after_check(compiled, instance["data"])
            if valid and refusal:
                lists["valid_refused"].append(f"test #{index}: {refusal}")
            elif valid and checked:
                lists["valid_flagged"].append(f"test #{index}: {short('; '.join(checked))}")
            elif not valid and refusal:
                counts["invalid_refused"] += 1
            elif not valid and checked:
                counts["invalid_caught"] += 1
            elif not valid:
                lists["invalid_accepted"].append(f"test #{index}: {instance['description']}")
        result.update(counts, **lists, mask_ns=masks, accept_ns=accepts)
    except Exception as error:  # anything but the documented schema errors is a crash
        result.update(status="crash", error=short(f"{type(error).__name__}: {error}"))
    finally:
        gc.enable()
    return result


def worker_main(conn: Connection, engine_name: str, vocabulary: dict[str, Any]) -> None:
    """Serve schemas for one engine x vocabulary until told to stop (``None``)."""
    from pathlib import Path

    capture_stderr()
    try:
        engine = ENGINES[engine_name]()
        tokenizer = None
        if engine_name != "formline":  # formline reads the GGUF file itself
            tokenizer, _ = load_tokenizer(Path(vocabulary["path"]))
        context = VocabularyContext(
            vocabulary["name"],
            Path(vocabulary["path"]),
            tokenizer,
            0.0,
            vocabulary["size"],
            vocabulary["eos_id"],
        )
        started = time.perf_counter_ns()
        engine.prepare(context)
        prep_ms = (time.perf_counter_ns() - started) / 1e6
        conn.send(("ready", {"version": engine.version(), "prep_ms": prep_ms}))
    except Exception as error:
        conn.send(("setup_error", short(f"{type(error).__name__}: {error}")))
        return
    while True:
        job = conn.recv()
        if job is None:
            return
        conn.send(("done", run_schema(engine, context, job, conn)))
