"""Core benchmark: formline vs. XGrammar vs. llguidance on the same grammars, texts and tokens.

Run from the repository root::

    python -m bench.core_bench [--vocabularies smollm2,qwen2]
        [--engines formline,xgrammar,llguidance] [--repeat 3] [--output bench/results/core.json]

For every engine x vocabulary x grammar it measures one-time vocabulary preprocessing, the
time to the first mask (compile + first fill), the per-step mask fill time and the per-token
accept time, walking canonical tokenizations (from the real Hugging Face tokenizer of each
vocabulary) of realistic texts. Every text is walked on a *freshly compiled* grammar, so each
walk is the first one on its grammar. What is cleared before each compile: formline's compiled
grammars (``compiler.clear_cache()``), XGrammar's compile cache (off), llguidance's matcher (a new
one). What stays, for every engine, is the per-vocabulary preparation (formline's token table, the
peers' tokenizer info), which "vocab prep" times once, and what each library memoizes at module
level (formline: small schema and grammar pieces and its stop-token rows). See bench/README.md.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if importlib.util.find_spec("formline") is None:  # running from a checkout, not installed
    sys.path.insert(0, str(ROOT / "src"))

ALL_VOCABULARIES = ("smollm2", "qwen2")
ALL_ENGINES = ("formline", "xgrammar", "llguidance")

# ---------------------------------------------------------------------------------------------
# Grammars and texts
# ---------------------------------------------------------------------------------------------

# ``[0-9]`` rather than ``\d``: llguidance's regex engine (Rust ``regex`` syntax) reads ``\d`` as
# any Unicode decimal digit, formline and XGrammar as ASCII. ``[0-9]`` is the same language
# for all three.
DATETIME_REGEX = (
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?"
    r"(Z|[+-][0-9]{2}:[0-9]{2})"
)
EMAIL_REGEX = r"[a-z0-9._%+-]{1,40}@[a-z0-9.-]{1,40}\.[a-z]{2,6}"

COUNTRIES = [
    "Afghanistan", "Albania", "Algeria", "Argentina", "Australia", "Austria", "Bangladesh",
    "Belgium", "Bolivia", "Brazil", "Canada", "Chile", "China", "Colombia", "Côte d'Ivoire",
    "Croatia", "Czechia", "Denmark", "Egypt", "Ethiopia", "Finland", "France", "Germany",
    "Ghana", "Greece", "Iceland", "India", "Indonesia", "Ireland", "Israel", "Italy", "Japan",
    "Kenya", "Mexico", "Morocco", "Netherlands", "New Zealand", "Nigeria", "Norway",
    "Pakistan", "Peru", "Philippines", "Poland", "Portugal", "Romania", "São Tomé and Príncipe",
    "Saudi Arabia", "South Africa", "South Korea", "Spain", "Sweden", "Switzerland",
    "Türkiye", "Ukraine", "United Kingdom", "United States of America", "Vietnam",
]  # fmt: skip

# Generic compact JSON (no whitespace), recursive, in GBNF: formline parses it with from_gbnf,
# XGrammar's EBNF is GBNF-compatible, llguidance gets it through its own GBNF->Lark converter.
# Two spellings of the same language that differ only in the string rule:
# * "json-star": strings as a starred alternation, as in llama.cpp's grammars/json.gbnf;
# * "json-rrec": strings as a right-recursive rule that ends at the closing quote, the shape of
#   XGrammar's built-in JSON grammar.
# Engines are sensitive to the spelling in different ways, so both are measured.
JSON_GBNF_COMMON = r"""
root   ::= value
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ( member ( "," member )* )? "}"
member ::= string ":" value
array  ::= "[" ( value ( "," value )* )? "]"
number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
escape ::= ["\\/bfnrt] | "u" [0-9a-fA-F]{4}
"""
JSON_GBNF_STAR = (
    JSON_GBNF_COMMON
    + r"""string ::= "\"" ( [^"\\\x00-\x1f] | "\\" escape )* "\""
"""
)
JSON_GBNF_RREC = (
    JSON_GBNF_COMMON
    + r"""string ::= "\"" chars
chars  ::= "\"" | [^"\\\x00-\x1f] chars | "\\" escape chars
"""
)

_JSON_OBJECTS: list[tuple[Any, bool]] = [  # (value, ensure_ascii)
    (
        {
            "id": 48213,
            "name": "Zoë Müller-Łukasiewicz",
            "email": "zoe.mueller@example.org",
            "active": True,
            "score": -12.75,
            "tags": ["admin", "beta-tester", "über"],
            "address": {"city": "Zürich", "zip": "8001", "geo": [47.3769, 8.5417]},
            "manager": None,
        },
        False,
    ),
    (
        {
            "order": "A-2024-000917",
            "items": [
                {"sku": "KB-75", "qty": 2, "price": 49.99, "note": 'He said "ship fast"'},
                {"sku": "MS-12", "qty": 1, "price": 1.5e2, "discount": 0},
            ],
            "total": 249.98,
            "paid": False,
            "currency": "EUR",
        },
        False,
    ),
    (
        {
            "title": "東京の天気 ☀️ — forecast",
            "days": [
                {"d": "2025-01-01", "hi": 9.1, "lo": -0.4, "rain": [0, 0, 0.2]},
                {"d": "2025-01-02", "hi": 11, "lo": 1.25e-1, "rain": []},
            ],
            "source": {"name": "JMA", "url": "https://www.jma.go.jp/", "ok": True},
            "emoji": "🌧️🌈",
        },
        False,
    ),
    (
        {
            "log": "line one\nline two\ttabbed \\ backslash",
            "path": "C:\\Users\\test\\file.json",
            "unicode": "café – naïve – Ελληνικά",
            "nested": {"a": {"b": {"c": [1, [2, [3, {"d": None}]]]}}},
            "big": 12345678901234567890,
            "neg": -0.0001,
            "flags": [True, False, None],
        },
        True,
    ),
]


def _compact_json(value: Any, ensure_ascii: bool) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, separators=(",", ":"))


@dataclass
class GrammarCase:
    """One language, written for each engine, plus strings of that language."""

    name: str
    kind: str  # "regex", "choice" or "gbnf"
    source: Any  # regex text, list of choices, or GBNF text
    texts: list[str]
    notes: str = ""


def grammar_cases() -> list[GrammarCase]:
    json_texts = [_compact_json(value, ascii_only) for value, ascii_only in _JSON_OBJECTS]
    return [
        GrammarCase(
            "regex-datetime",
            "regex",
            DATETIME_REGEX,
            [
                "2024-03-15T14:30:00Z",
                "1999-12-31T23:59:59.999999+05:30",
                "2025-11-29T08:05:17.123-08:00",
                "2000-01-01T00:00:00+00:00",
                "2031-07-04T12:00:00.5Z",
            ],
            "[0-9] instead of \\d (llguidance's \\d is Unicode).",
        ),
        GrammarCase(
            "regex-email",
            "regex",
            EMAIL_REGEX,
            [
                "john.doe@example.com",
                "a.very_long+tag%name@mail.sub-domain.example.org",
                "x@y.io",
                "support-team.2024@company-internal.co.uk",
            ],
        ),
        GrammarCase(
            "choice-country",
            "choice",
            COUNTRIES,
            [
                "United States of America",
                "Côte d'Ivoire",
                "São Tomé and Príncipe",
                "New Zealand",
                "Japan",
            ],
            f"{len(COUNTRIES)} country names. formline: Grammar.from_choices; XGrammar: EBNF "
            "alternation of literals; llguidance: llguidance.grammar_from('choice', ...).",
        ),
        GrammarCase(
            "json-star",
            "gbnf",
            JSON_GBNF_STAR,
            json_texts,
            "Generic compact JSON, strings as ( char | escape )* (llama.cpp json.gbnf style). "
            "llguidance gets the Lark text of llguidance.gbnf_to_lark.any_to_lark.",
        ),
        GrammarCase(
            "json-rrec",
            "gbnf",
            JSON_GBNF_RREC,
            json_texts,
            "Same language, strings as a right-recursive rule (XGrammar built-in style). "
            "llguidance gets the Lark text of llguidance.gbnf_to_lark.any_to_lark.",
        ),
    ]


def gbnf_literal(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def choices_gbnf(choices: list[str]) -> str:
    return "root ::= " + " | ".join(gbnf_literal(choice) for choice in choices) + "\n"


# ---------------------------------------------------------------------------------------------
# Vocabularies
# ---------------------------------------------------------------------------------------------


@dataclass
class VocabularyContext:
    """A vocabulary's tokenizer (shared by the peers) and the canonical tokens of every text."""

    name: str
    path: Path
    tokenizer: Any
    tokenizer_load_ms: float
    size: int
    eos_id: int
    tokens: dict[str, list[int]] = field(default_factory=dict)
    roundtrip_problems: list[str] = field(default_factory=list)


_tokenizer_cache: dict[Path, tuple[Any, float]] = {}


def load_tokenizer(path: Path) -> tuple[Any, float]:
    """The transformers tokenizer of a GGUF file (cached) and its load time in ms."""
    if path not in _tokenizer_cache:
        import transformers
        from transformers import AutoTokenizer

        transformers.logging.set_verbosity_error()
        started = time.perf_counter_ns()
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        _tokenizer_cache[path] = (tokenizer, (time.perf_counter_ns() - started) / 1e6)
    return _tokenizer_cache[path]


def vocabulary_context(name: str, cases: list[GrammarCase]) -> VocabularyContext:
    from formline.vocab import Vocabulary
    from formline.vocab.fixtures import fixture_path

    path = fixture_path(name)
    tokenizer, load_ms = load_tokenizer(path)
    vocabulary = Vocabulary.from_gguf(path)  # only for the size, the eos ids and a check
    eos_id = tokenizer.eos_token_id
    if eos_id is None or eos_id not in vocabulary.eos_ids:
        eos_id = min(vocabulary.eos_ids)
    context = VocabularyContext(name, path, tokenizer, load_ms, vocabulary.size, eos_id)
    for case in cases:
        for text in case.texts:
            ids = list(tokenizer.encode(text, add_special_tokens=False))
            context.tokens[text] = ids
            joined = b"".join(vocabulary.token_bytes[token_id] for token_id in ids)
            if joined != text.encode("utf-8"):
                context.roundtrip_problems.append(
                    f"{name}: formline token bytes of {text[:30]!r}... give {joined[:60]!r}"
                )
    return context


# ---------------------------------------------------------------------------------------------
# Engines: the same small interface for each
# ---------------------------------------------------------------------------------------------


def _bit(row: Any, token_id: int) -> bool:
    return bool((int(row[token_id >> 5]) >> (token_id & 31)) & 1)


class Engine:
    name = ""

    def version(self) -> str:
        return importlib.metadata.version(self.name)

    def prepare(self, context: VocabularyContext) -> None:
        """One-time per-vocabulary preprocessing (timed by the caller)."""

    def reset_caches(self, context: VocabularyContext) -> None:
        """Forget compiled grammars (untimed; re-creates vocabulary state if needed)."""

    def translate(self, case: GrammarCase) -> Any:
        """The grammar in this engine's input format (untimed, done once per case)."""
        return case.source

    def compile(self, case: GrammarCase, source: Any) -> Any:
        raise NotImplementedError

    def matcher(self, compiled: Any) -> Any:
        raise NotImplementedError

    def allocate(self, context: VocabularyContext) -> Any:
        raise NotImplementedError

    def fill(self, matcher: Any, bitmask: Any) -> None:
        raise NotImplementedError

    def accept(self, matcher: Any, token_id: int) -> bool:
        raise NotImplementedError

    def allowed(self, bitmask: Any, token_id: int) -> bool:
        return _bit(bitmask[0], token_id)

    def error(self, matcher: Any) -> str:
        return ""

    def compile_statistics(self, compiled: Any) -> dict[str, Any]:
        return {}


class FormlineEngine(Engine):
    name = "formline"

    def version(self) -> str:
        try:
            return importlib.metadata.version("formline")
        except importlib.metadata.PackageNotFoundError:
            import formline

            return getattr(formline, "__version__", "checkout")

    def __init__(self) -> None:
        from formline import GrammarCompiler, mask
        from formline.grammar import Grammar
        from formline.vocab import Vocabulary

        self.mask = mask
        self.compiler_class = GrammarCompiler
        self.grammar_class = Grammar
        self.vocabulary_class = Vocabulary
        self.vocabulary: Any = None
        self.compiler: Any = None

    def prepare(self, context: VocabularyContext) -> None:
        self.vocabulary = self.vocabulary_class.from_gguf(context.path)
        self.compiler = self.compiler_class(self.vocabulary, disk_cache=False)
        self.compiler.cache.token_table(self.vocabulary)  # vocabulary preparation

    def reset_caches(self, context: VocabularyContext) -> None:
        # Compiled grammars are forgotten; the token table (vocabulary preparation, measured
        # in prepare) stays, as the peers keep their tokenizer info. The module-level
        # functools caches (schema and grammar pieces, stop-token rows) stay too: they are
        # the process's, as a server's would be, and clearing them needs private names.
        self.compiler.clear_cache()

    def translate(self, case: GrammarCase) -> Any:
        return case.source

    def compile(self, case: GrammarCase, source: Any) -> Any:
        if case.kind == "regex":
            grammar = self.grammar_class.from_regex(source)
        elif case.kind == "choice":
            grammar = self.grammar_class.from_choices(source)
        else:
            grammar = self.grammar_class.from_gbnf(source)
        return self.compiler.compile_grammar(grammar)

    def matcher(self, compiled: Any) -> Any:
        return self.mask.GrammarMatcher(compiled)

    def allocate(self, context: VocabularyContext) -> Any:
        return self.mask.allocate_token_bitmask(1, self.vocabulary.size)

    def fill(self, matcher: Any, bitmask: Any) -> None:
        matcher.fill_next_token_bitmask(bitmask, 0)

    def accept(self, matcher: Any, token_id: int) -> bool:
        return bool(matcher.accept_token(token_id))

    def compile_statistics(self, compiled: Any) -> dict[str, Any]:
        stats = compiled.statistics
        return {
            "seconds": stats.seconds,
            "states": stats.states,
            "unique_masks": stats.unique_masks,
            "escape_groups": stats.escape_groups,
            "states_walked": stats.states_walked,
        }


class XGrammarEngine(Engine):
    name = "xgrammar"

    def __init__(self) -> None:
        import xgrammar

        self.xgr = xgrammar
        self.compiler: Any = None
        self.info: Any = None

    def prepare(self, context: VocabularyContext) -> None:
        self.info = self.xgr.TokenizerInfo.from_huggingface(
            context.tokenizer, vocab_size=context.size, stop_token_ids=[context.eos_id]
        )
        # One compile thread (the default is 8) to compare with single-threaded formline and
        # llguidance; the compile cache is off so every compile is a real one.
        self.compiler = self.xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)

    def reset_caches(self, context: VocabularyContext) -> None:
        self.compiler.clear_cache()

    def translate(self, case: GrammarCase) -> Any:
        if case.kind == "choice":
            return choices_gbnf(case.source)
        return case.source

    def compile(self, case: GrammarCase, source: Any) -> Any:
        if case.kind == "regex":
            return self.compiler.compile_regex(source)
        return self.compiler.compile_grammar(source)

    def matcher(self, compiled: Any) -> Any:
        return self.xgr.GrammarMatcher(compiled)

    def allocate(self, context: VocabularyContext) -> Any:
        return self.xgr.allocate_token_bitmask(1, context.size)

    def fill(self, matcher: Any, bitmask: Any) -> None:
        matcher.fill_next_token_bitmask(bitmask, 0)

    def accept(self, matcher: Any, token_id: int) -> bool:
        return bool(matcher.accept_token(token_id))

    def allowed(self, bitmask: Any, token_id: int) -> bool:
        return _bit(bitmask[0].numpy(), token_id)


class LLGuidanceEngine(Engine):
    name = "llguidance"

    def __init__(self) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.numpy
        from llguidance.gbnf_to_lark import any_to_lark

        self.llg = llguidance
        self.fill_numpy = llguidance.numpy.fill_next_token_bitmask
        self.allocate_numpy = llguidance.numpy.allocate_token_bitmask
        self.any_to_lark = any_to_lark
        self.tokenizer: Any = None

    def prepare(self, context: VocabularyContext) -> None:
        self.tokenizer = self.llg.hf.from_tokenizer(
            context.tokenizer, n_vocab=context.size, eos_token=context.eos_id
        )

    def translate(self, case: GrammarCase) -> Any:
        if case.kind == "regex":
            return self.llg.LLMatcher.grammar_from_regex(case.source)
        if case.kind == "choice":
            return self.llg.grammar_from("choice", json.dumps(case.source))
        return self.llg.LLMatcher.grammar_from_lark(self.any_to_lark(case.source))

    def lark_text(self, case: GrammarCase) -> str:
        return self.any_to_lark(case.source) if case.kind == "gbnf" else ""

    def compile(self, case: GrammarCase, source: Any) -> Any:
        matcher = self.llg.LLMatcher(self.tokenizer, source, log_level=0)
        if matcher.is_error():
            raise RuntimeError(f"LLMatcher: {matcher.get_error()}")
        return matcher

    def matcher(self, compiled: Any) -> Any:
        return compiled  # an LLMatcher is both the compiled grammar and the parse state

    def allocate(self, context: VocabularyContext) -> Any:
        return self.allocate_numpy(1, context.size)

    def fill(self, matcher: Any, bitmask: Any) -> None:
        self.fill_numpy(matcher, bitmask, 0)

    def accept(self, matcher: Any, token_id: int) -> bool:
        return bool(matcher.consume_token(token_id))

    def error(self, matcher: Any) -> str:
        return matcher.get_error() if matcher.is_error() else ""


ENGINE_CLASSES: dict[str, Callable[[], Engine]] = {
    "formline": FormlineEngine,
    "xgrammar": XGrammarEngine,
    "llguidance": LLGuidanceEngine,
}


# ---------------------------------------------------------------------------------------------
# Measurement
# ---------------------------------------------------------------------------------------------


@dataclass
class CaseResult:
    engine: str
    vocabulary: str
    grammar: str
    prep_ms: list[float] = field(default_factory=list)
    first_mask_ms: list[float] = field(default_factory=list)  # compile + matcher + first fill
    compile_only_ms: list[float] = field(default_factory=list)
    mask_ns: list[int] = field(default_factory=list)  # every fill, the first one included
    accept_ns: list[int] = field(default_factory=list)  # text tokens and the final EOS
    tokens_measured: int = 0
    texts_completed: int = 0
    errors: list[str] = field(default_factory=list)
    compile_statistics: list[dict[str, Any]] = field(default_factory=list)

    def add_error(self, message: str) -> None:
        if message not in self.errors:
            self.errors.append(message)


def _step_label(context: VocabularyContext, tokens: list[int], position: int) -> str:
    if position == len(tokens):
        return f"EOS id {context.eos_id}"
    token_id = tokens[position]
    return f"token #{position} id {token_id} ({context.tokenizer.decode([token_id])!r})"


def walk_text(
    engine: Engine,
    context: VocabularyContext,
    case: GrammarCase,
    source: Any,
    text: str,
    result: CaseResult,
) -> None:
    """Compile ``case`` afresh, then walk the canonical tokens of ``text`` plus EOS once."""
    tokens = context.tokens[text]
    engine.reset_caches(context)
    bitmask = engine.allocate(context)
    gc.collect()
    gc.disable()
    try:
        started = time.perf_counter_ns()
        compiled = engine.compile(case, source)
        compiled_at = time.perf_counter_ns()
        matcher = engine.matcher(compiled)
        matcher_at = time.perf_counter_ns()
        engine.fill(matcher, bitmask)
        first = time.perf_counter_ns()
        result.first_mask_ms.append((first - started) / 1e6)
        result.compile_only_ms.append((compiled_at - started) / 1e6)
        result.mask_ns.append(first - matcher_at)
        stats = engine.compile_statistics(compiled)
        if stats:
            result.compile_statistics.append(stats)
        steps = [*tokens, context.eos_id]
        for position, token_id in enumerate(steps):
            if position > 0:
                before = time.perf_counter_ns()
                engine.fill(matcher, bitmask)
                result.mask_ns.append(time.perf_counter_ns() - before)
            problem = engine.error(matcher)
            if problem:
                label = _step_label(context, tokens, position)
                result.add_error(f"{text[:24]!r}: error before {label}: {problem}")
                return
            in_mask = engine.allowed(bitmask, token_id)
            before = time.perf_counter_ns()
            accepted = engine.accept(matcher, token_id)
            result.accept_ns.append(time.perf_counter_ns() - before)
            if not accepted:
                label = _step_label(context, tokens, position)
                detail = engine.error(matcher)
                result.add_error(
                    f"{text[:24]!r}: {label} rejected" + (f": {detail}" if detail else "")
                )
                return
            if not in_mask:
                label = _step_label(context, tokens, position)
                result.add_error(f"{text[:24]!r}: {label} accepted but not in the mask")
            result.tokens_measured += 1
        result.texts_completed += 1
    finally:
        gc.enable()


def run_case(
    engine: Engine, context: VocabularyContext, case: GrammarCase, repeat: int
) -> CaseResult:
    result = CaseResult(engine.name, context.name, case.name)
    try:
        source = engine.translate(case)
    except Exception as error:  # a grammar the engine cannot take is a row, not a crash
        result.add_error(f"grammar translation failed: {type(error).__name__}: {error}")
        return result
    for _ in range(repeat):
        for text in case.texts:
            try:
                walk_text(engine, context, case, source, text, result)
            except Exception as error:
                result.add_error(f"{text[:24]!r}: {type(error).__name__}: {error}")
    return result


def prepare_engine(engine: Engine, context: VocabularyContext) -> tuple[float, str]:
    gc.collect()
    started = time.perf_counter_ns()
    try:
        engine.prepare(context)
    except Exception as error:
        return 0.0, f"vocabulary preparation failed: {type(error).__name__}: {error}"
    return (time.perf_counter_ns() - started) / 1e6, ""


# ---------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------


def _percentile_us(values: list[int], q: float) -> float | None:
    if not values:
        return None
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) / 1e3


def summarize(result: CaseResult) -> dict[str, Any]:
    def median(values: list[float]) -> float | None:
        return statistics.median(values) if values else None

    return {
        "engine": result.engine,
        "vocabulary": result.vocabulary,
        "grammar": result.grammar,
        "vocab_prep_ms": median(result.prep_ms),
        "compile_ms": median(result.first_mask_ms),
        "compile_ms_max": max(result.first_mask_ms) if result.first_mask_ms else None,
        "compile_only_ms": median(result.compile_only_ms),
        "mask_p50_us": _percentile_us(result.mask_ns, 50),
        "mask_p99_us": _percentile_us(result.mask_ns, 99),
        "mask_max_us": max(result.mask_ns) / 1e3 if result.mask_ns else None,
        "accept_p50_us": _percentile_us(result.accept_ns, 50),
        "tokens_measured": result.tokens_measured,
        "texts_completed": result.texts_completed,
        "errors": result.errors,
    }


def _cell(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def markdown_table(summaries: list[dict[str, Any]]) -> str:
    header = (
        "| engine | vocabulary | grammar | vocab prep ms | compile ms | mask p50 µs | "
        "mask p99 µs | mask max µs | accept p50 µs | tokens measured | errors |"
    )
    lines = [header, "|" + "---|" * 11]
    for row in summaries:
        errors = "; ".join(row["errors"]).replace("|", "\\|").replace("\n", " ")
        if len(errors) > 160:
            errors = errors[:157] + "..."
        lines.append(
            f"| {row['engine']} | {row['vocabulary']} | {row['grammar']} | "
            f"{_cell(row['vocab_prep_ms'])} | {_cell(row['compile_ms'], 2)} | "
            f"{_cell(row['mask_p50_us'])} | {_cell(row['mask_p99_us'])} | "
            f"{_cell(row['mask_max_us'])} | {_cell(row['accept_p50_us'])} | "
            f"{row['tokens_measured']} | {errors or 'none'} |"
        )
    return "\n".join(lines) + "\n"


def publish(report: str, path: Path) -> None:
    """Write a bench's markdown ``report`` to ``path`` (its folder made) and print it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(report)
    print(report)


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions: dict[str, str] = {}
    for package in ("numpy", "transformers", "tokenizers", "torch", "xgrammar", "llguidance"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "not installed"
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {
        "cpu_model": cpu,
        "cpu_count": os.cpu_count(),
        "cpus_usable": affinity,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "versions": versions,
    }


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------


def _names(text: str, allowed: tuple[str, ...], what: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in allowed]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {what} {unknown}; known: {', '.join(allowed)}")
    return names


def parse_arguments(arguments: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.core_bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--vocabularies",
        type=lambda text: _names(text, ALL_VOCABULARIES, "vocabularies"),
        default=list(ALL_VOCABULARIES),
        help="comma-separated subset of: smollm2,qwen2 (default: both)",
    )
    parser.add_argument(
        "--engines",
        type=lambda text: _names(text, ALL_ENGINES, "engines"),
        default=list(ALL_ENGINES),
        help="comma-separated subset of: formline,xgrammar,llguidance (default: all)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="walks of every text, each on a fresh compile (default 3)",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=ROOT / "bench" / "results" / "core.json",
        help="JSON output; the Markdown table goes next to it with a .md suffix",
    )
    namespace = parser.parse_args(arguments)
    if namespace.repeat < 1:
        parser.error("--repeat must be at least 1")
    return namespace


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def load_engines(names: list[str]) -> dict[str, Engine | str]:
    """Each engine by name, or why it could not be loaded (a missing or broken peer is
    reported, not fatal)."""
    engines: dict[str, Engine | str] = {}
    for name in names:
        try:
            engines[name] = ENGINE_CLASSES[name]()
        except Exception as error:
            engines[name] = f"import failed: {type(error).__name__}: {error}"
            progress(f"{name}: {engines[name]}")
    return engines


def run_engine(
    engine_name: str,
    engine: Engine | str,
    context: VocabularyContext,
    cases: list[GrammarCase],
    repeat: int,
) -> Iterator[CaseResult]:
    """Each case's result for one engine on one vocabulary (an engine that could not be
    loaded or prepared: the error, for every case)."""
    prep_ms: list[float] = []
    prep_error = engine if isinstance(engine, str) else ""
    if isinstance(engine, Engine):
        for _ in range(repeat):
            elapsed, prep_error = prepare_engine(engine, context)
            if prep_error:
                break
            prep_ms.append(elapsed)
    for case in cases:
        if isinstance(engine, Engine) and not prep_error:
            result = run_case(engine, context, case, repeat)
        else:
            result = CaseResult(engine_name, context.name, case.name)
            result.add_error(prep_error)
        result.prep_ms = prep_ms
        yield result


def sorted_summaries(
    results: list[CaseResult], options: argparse.Namespace, cases: list[GrammarCase]
) -> list[dict[str, Any]]:
    """The results' summaries by vocabulary, grammar and engine, in the order asked."""
    order = {name: index for index, name in enumerate(options.engines)}
    grammar_order = {case.name: index for index, case in enumerate(cases)}
    vocabulary_order = {name: index for index, name in enumerate(options.vocabularies)}
    return sorted(
        map(summarize, results),
        key=lambda row: (
            vocabulary_order[row["vocabulary"]],
            grammar_order[row["grammar"]],
            order[row["engine"]],
        ),
    )


METHOD = {
    "timer": "time.perf_counter_ns",
    "cold_walks": "every text is walked once per repeat on a freshly compiled grammar "
    "(formline: compiler.clear_cache() forgets compiled grammars, disk_cache=False; "
    "xgrammar: cache_enabled=False; llguidance: a new LLMatcher); kept: each engine's "
    "per-vocabulary preparation (formline's token table, the peers' tokenizer info) and "
    "module-level memoized pieces (formline: schema/grammar pieces, stop-token rows)",
    "compile_ms": "median time to first mask: compile + matcher creation + first fill "
    "(compile_only_ms: the compile call alone)",
    "mask": "fill_next_token_bitmask per step, the first (cold) fill included; one "
    "step per text token plus the final step where EOS must be allowed",
    "accept": "accept per text token plus the final EOS",
    "xgrammar": "GrammarCompiler(max_threads=1, cache_enabled=False)",
    "gc": "garbage collector disabled during each compile + walk",
}


def grammar_records(
    cases: list[GrammarCase], contexts: dict[str, VocabularyContext], llguidance: Any
) -> list[dict[str, Any]]:
    """The report's description of each grammar: its source in each engine's form and its
    texts' lengths in characters and in each vocabulary's tokens."""
    return [
        {
            "name": case.name,
            "kind": case.kind,
            "source": case.source,
            "notes": case.notes,
            "xgrammar_source": choices_gbnf(case.source) if case.kind == "choice" else None,
            "llguidance_lark": (
                llguidance.lark_text(case) if isinstance(llguidance, LLGuidanceEngine) else None
            ),
            "texts": [
                {
                    "text": text,
                    "characters": len(text),
                    "tokens": {name: len(c.tokens[text]) for name, c in contexts.items()},
                }
                for text in case.texts
            ],
        }
        for case in cases
    ]


def write_report(report: dict[str, Any], output: Path, table: str, repeat: int) -> None:
    """``report`` as JSON at ``output`` and its table as Markdown beside it."""
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    markdown = output.with_suffix(".md")
    machine = report["machine"]
    markdown.write_text(
        f"# Core benchmark\n\n`{report['command']}` on {machine['cpu_model']} "
        f"({machine['cpu_count']} cores), Python {machine['python']}; "
        f"engines: {report['engine_versions']}. Repeat {repeat}, every walk on a "
        "fresh compile (see bench/README.md).\n\n" + table
    )
    progress(f"wrote {output} and {markdown} in {report['elapsed_s']:.0f} s")


def main(arguments: list[str] | None = None) -> int:
    options = parse_arguments(arguments)
    cases = grammar_cases()
    started = time.perf_counter()
    engines = load_engines(options.engines)
    results: list[CaseResult] = []
    contexts: dict[str, VocabularyContext] = {}
    total = len(options.vocabularies) * len(options.engines) * len(cases)
    for vocabulary_name in options.vocabularies:
        progress(f"loading tokenizer and tokenizing texts for {vocabulary_name} ...")
        context = contexts[vocabulary_name] = vocabulary_context(vocabulary_name, cases)
        for problem in context.roundtrip_problems:
            progress(f"warning: {problem}")
        for engine_name in options.engines:
            for result in run_engine(
                engine_name, engines[engine_name], context, cases, options.repeat
            ):
                results.append(result)
                row = summarize(result)
                progress(
                    f"[{len(results)}/{total}] {engine_name} {vocabulary_name} "
                    f"{result.grammar}: compile {_cell(row['compile_ms'], 2)} ms, mask p50 "
                    f"{_cell(row['mask_p50_us'])} µs p99 {_cell(row['mask_p99_us'])} µs, "
                    f"{row['tokens_measured']} tokens, "
                    + (f"ERRORS: {row['errors']}" if row["errors"] else "ok")
                )
    summaries = sorted_summaries(results, options, cases)
    table = markdown_table(summaries)
    print(table)
    report = {
        "command": " ".join(["python -m bench.core_bench", *(arguments or sys.argv[1:])]),
        "repeat": options.repeat,
        "elapsed_s": time.perf_counter() - started,
        "machine": machine_info(),
        "engine_versions": {
            name: (engine.version() if isinstance(engine, Engine) else engine)
            for name, engine in engines.items()
        },
        "method": METHOD,
        "vocabularies": {
            name: {
                "path": str(context.path),
                "size": context.size,
                "eos_id": context.eos_id,
                "hf_tokenizer_load_ms": context.tokenizer_load_ms,
                "roundtrip_problems": context.roundtrip_problems,
            }
            for name, context in contexts.items()
        },
        "grammars": grammar_records(cases, contexts, engines.get("llguidance")),
        "summary": summaries,
        "raw": [vars(result) for result in results],
    }
    write_report(report, options.output, table, options.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
