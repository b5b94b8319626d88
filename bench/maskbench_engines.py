"""MaskBench engine adapters and the worker process that runs one engine on one vocabulary.

The adapters extend bench.core_bench's engines (vocabulary preparation, matcher, bitmask, fill,
accept and error handling are theirs) with a JSON-schema compile, the engine's documented
"unsupported schema" errors, its own compile limits (formline's), and, for formline, the
after-check and its report of the keywords it leaves to it. A worker (``worker_main``) is a
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


class LimitReachedError(UnsupportedSchemaError):
    """The engine stopped the compile at one of its own limits (time, automaton states,
    parser stacks): what a peer does by running past MaskBench's time limit, so MaskBench
    counts it as a timeout (status ``limit``), not as a refusal of the schema.

    A subclass of UnsupportedSchemaError so that callers that only ask whether a schema
    compiled (``bench.cached_compiles``) keep treating it as "not compiled"; MaskBench
    catches it first."""


class SchemaEngine(Engine):
    """What MaskBench needs on top of core_bench's Engine."""

    options: ClassVar[dict[str, Any]] = {}
    # Whether after_check is a real check and compile_details reports the keywords left to
    # it (formline): the table then shows the schemas compiled with keywords checked after,
    # formline's counterpart of a peer's warning that it dropped or weakened a keyword.
    has_after_check: ClassVar[bool] = False
    # The engine's own limit errors (set by engines that have them): raised during the
    # first mask or the walk they end the schema as a limit, like a peer's timeout.
    limit_errors: tuple[type[BaseException], ...] = ()

    def compile_schema(self, schema: Any) -> Any:
        """Compile (timed). Raises UnsupportedSchemaError for documented schema errors,
        LimitReachedError where the engine stopped at one of its own limits."""
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
        "memory_cache": "compiled grammars cleared before each schema (compiler.clear_cache()); "
        "the vocabulary's token table and module-level memoized pieces kept",
        "on_unsupported": "error",
    }
    has_after_check = True

    def __init__(self) -> None:
        super().__init__()
        from formline import CompileLimitError
        from formline.grammar import GrammarError
        from formline.parser.pushdown import ParserLimitError
        from formline.schema import SchemaError

        # Both limits are GrammarError subclasses: they must be told apart before
        # GrammarError, the documented refusal, takes them. A compile_json_schema call
        # raises them as a SchemaError with ``limit`` set (compile_schema below); a first
        # mask or a walk that builds automaton states lazily can raise them as they are.
        self.limit_errors = (CompileLimitError, ParserLimitError)
        self.declined = (SchemaError, GrammarError)

    def compile_schema(self, schema: Any) -> Any:
        try:
            return self.compiler.compile_json_schema(schema)
        except self.limit_errors as error:
            raise LimitReachedError(f"{type(error).__name__}: {error}") from error
        except self.declined as error:
            # The schema compile re-raises a limit error as a SchemaError naming the limit
            # passed (``limit``: seconds, nfa_states, ...); one without is a refusal.
            if getattr(error, "limit", None) is not None:
                raise LimitReachedError(f"{type(error).__name__}: {error}") from error
            raise UnsupportedSchemaError(f"{type(error).__name__}: {error}") from error

    def new_matcher(self, compiled: Any) -> Any:
        return self.mask.GrammarMatcher(compiled.compiled_grammar)

    def after_check(self, compiled: Any, data: Any) -> list[str] | None:
        return list(compiled.check(data))

    def compile_details(self, compiled: Any) -> dict[str, Any]:
        # The compiled schema's report lists every keyword use the grammar leaves to the
        # after-check (checked_after); with on_unsupported="error" (the default) its
        # unsupported list stays empty, an unsupported keyword being a SchemaError.
        report = compiled.report
        checked_after = getattr(report, "checked_after", ())
        return {
            "enforced": len(getattr(report, "enforced", ())),
            "checked_after_count": len(checked_after),
            "checked_after": [short(use) for use in checked_after][:10],
            "unsupported": [short(use) for use in getattr(report, "unsupported", ())][:10],
        }


class XGrammarSchemaEngine(XGrammarEngine, SchemaEngine):
    options: ClassVar[dict[str, Any]] = {
        "any_whitespace": False,
        "separators": [",", ":"],
        # XGrammar's default (and vLLM's use of it): properties and items the schema does
        # not declare are forbidden, so some valid instances are refused (counted as such).
        # With False, JSON Schema's semantics, the 2026-12-07 run refused 21 valid instances
        # instead of 46, but its TTFM p50 was 605 ms instead of 18 and 10 schemas timed out
        # (bench/README.md): the default is how its users meet it.
        "strict_mode": True,
        "max_threads": 1,
        "cache_enabled": False,
    }

    def compile_schema(self, schema: Any) -> Any:
        try:
            return self.compiler.compile_json_schema(
                json.dumps(schema),
                any_whitespace=False,
                separators=(",", ":"),
                strict_mode=self.options["strict_mode"],
            )
        except RuntimeError as error:  # xgrammar's C++ errors: invalid or unsupported schema
            raise UnsupportedSchemaError(f"{type(error).__name__}: {error}") from error


class LLGuidanceSchemaEngine(LLGuidanceEngine, SchemaEngine):
    # Without coerce_one_of and lenient (both off by default): a oneOf or a keyword it does
    # not implement is its documented refusal, as an unsupported keyword is formline's.
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
    """Compile one schema (telling ``conn`` when it starts and has its first mask), walk it.

    Every instance is walked on a new matcher of the same compiled grammar, so an engine
    that caches masks in the grammar (formline) has them warm after the first walk, while
    llguidance recomputes them: ``first_walk_mask_ns`` keeps the fills of the first
    instance walked (valid or not), the walk no earlier instance warmed."""
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
        except LimitReachedError as error:
            result.update(status="limit", error=short(error))
            return result
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
        result.update(walk_instances(engine, compiled, bitmask, job))
    except engine.limit_errors as error:  # the engine's own limit, met by a mask or a step
        status = "walk_limit" if "ttfm_ms" in result else "limit"
        result.update(status=status, error=short(f"{type(error).__name__}: {error}"))
    except Exception as error:  # anything but the documented schema errors is a crash
        result.update(status="crash", error=short(f"{type(error).__name__}: {error}"))
    finally:
        gc.enable()
    return result


def walk_instances(
    engine: SchemaEngine, compiled: Any, bitmask: Any, job: dict[str, Any]
) -> dict[str, Any]:
    """Walk each of ``job``'s instances on a new matcher of ``compiled``: the counts of valid
    and invalid instances, refused or caught after, the lists of what went wrong, and the
    mask and accept times (over the valid instances' steps; ``first_walk_mask_ns``: the
    first instance's masks, valid or not).

    Raises:
        Whatever the engine raises for its own limits (``run_schema`` sorts them)."""
    counts = dict.fromkeys(("valid", "invalid", "invalid_refused", "invalid_caught"), 0)
    lists: dict[str, list[Any]] = {
        name: [] for name in ("valid_refused", "valid_flagged", "invalid_accepted", "mismatches")
    }
    times: dict[str, list[int]] = {"mask_ns": [], "accept_ns": [], "first_walk_mask_ns": []}
    for index, instance in enumerate(job["instances"]):
        valid = instance["valid"]
        counts["valid" if valid else "invalid"] += 1
        mismatches: list[str] = []
        instance_masks: list[int] = []
        instance_accepts: list[int] = []
        refusal = walk(
            engine,
            engine.new_matcher(compiled),
            bitmask,
            instance["tokens"],
            job["eos_id"],
            instance_masks,
            instance_accepts,
            mismatches,
        )
        if valid:  # the mask and accept figures are over the valid instances' steps
            times["mask_ns"] += instance_masks
            times["accept_ns"] += instance_accepts
        if index == 0:
            times["first_walk_mask_ns"] = instance_masks
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
    return {**counts, **lists, **times}


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
