"""The ``formline`` command line.

``formline demo`` runs constrained generation over SmolLM2's real 49,152-token vocabulary.
Until the model backends land, the "model" is a stand-in scorer in the spirit of seed 000:
it wants to answer chattily (a preamble, a Markdown fence, the age as words), and the mask
forces its choices onto the grammar. ``formline compile`` compiles a grammar (regex, EBNF,
GBNF or a JSON Schema, whose report of every keyword it prints) and what it cost. Errors
are one line on stderr; exit codes: 0 ok, 2 bad input or usage, 3 model failure, 4 output
cut off at max tokens, 5 output failed the after-check (see :mod:`.generation`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from formline.backends.base import BackendError, default_model_path
from formline.cli.arguments import at_least
from formline.cli.generation import EXIT_BACKEND
from formline.cli.generation import register as register_generation
from formline.evaluation.cli import register as register_evaluation
from formline.grammar import Grammar, GrammarError
from formline.mask import (
    GrammarMatcher,
    allocate_token_bitmask,
    apply_token_bitmask_inplace,
    compile_grammar,
)
from formline.schema import compile_schema, schema_of
from formline.schema.lint import lint_schema
from formline.server.cli import register as register_serve
from formline.trace.cli import register as register_trace
from formline.vocab import Vocabulary

DEMO_PATTERN = r'\{"name":"[A-Z][a-z]+( [A-Z][a-z]+)*","age":(0|[1-9][0-9]{0,2})\}'
DEMO_WISH = 'Sure! Here is the JSON:\n```json\n{"name": "Ada Lovelace", "age": "thirty-six"}\n```'


def _load_vocabulary(path: str | None) -> Vocabulary:
    """The vocabulary of ``path``, else the embedded model's (the installed wheel's GGUF: the
    test fixture cache, read before, is not there on a user's machine)."""
    return Vocabulary.from_gguf(path or default_model_path())


def _wish_scores(vocabulary: Vocabulary, wish: bytes, produced: bytes) -> np.ndarray:
    """Stand-in logits: favour tokens that continue the wished text (longest first)."""
    scores = np.zeros(vocabulary.size, dtype=np.float32)
    for start in range(len(produced) + 1):
        suffix = produced[start:]
        position = wish.find(suffix) if suffix else 0
        if position >= 0:
            rest = wish[position + len(suffix) :]
            for length in range(1, min(len(rest), 12) + 1):
                token_id = vocabulary.token_id(rest[:length])
                if token_id is not None:
                    scores[token_id] = 10.0 + length
            break
    return scores


def run_demo(arguments: argparse.Namespace) -> int:
    started = time.perf_counter()
    vocabulary = _load_vocabulary(arguments.vocabulary)
    loaded = time.perf_counter()
    compiled = compile_grammar(Grammar.from_regex(DEMO_PATTERN), vocabulary)
    compiled_at = time.perf_counter()
    print(f"vocabulary: {vocabulary.size} tokens ({loaded - started:.2f} s to load)")
    print(f"grammar:    {DEMO_PATTERN}")
    print(f"compile:    {compiled.statistics_text()} [{(compiled_at - loaded) * 1000:.1f} ms]")
    print(f"the stand-in model wants to write: {DEMO_WISH!r}")
    matcher = GrammarMatcher(compiled)
    bitmask = allocate_token_bitmask(1, vocabulary.size)
    produced = b""
    mask_times: list[float] = []
    rng = np.random.default_rng(arguments.seed)
    for _ in range(arguments.max_tokens):
        logits = _wish_scores(vocabulary, DEMO_WISH.encode(), produced)
        logits += rng.normal(0, 0.01, size=logits.shape).astype(np.float32)
        best_free = int(np.argmax(logits))
        tick = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask)
        mask_times.append(time.perf_counter() - tick)
        apply_token_bitmask_inplace(logits, bitmask[0])
        choice = int(np.argmax(logits))
        refused = "" if choice == best_free else f"   (wanted {_show(vocabulary, best_free)})"
        print(f"  {_show(vocabulary, choice):<14}{refused}")
        if not matcher.accept_token(choice):
            print("error: the matcher refused a token its own mask allowed", file=sys.stderr)
            return 3
        if matcher.is_terminated():
            break
        produced += vocabulary.token_bytes[choice]
    text = produced.decode("utf-8", "replace")
    print(f"output:     {text}")
    finish = "stop" if matcher.is_terminated() else "length"
    print(f"finish:     {finish}; mask p50 {np.median(mask_times) * 1e6:.0f} µs per token")
    return 0


def _show(vocabulary: Vocabulary, token_id: int) -> str:
    if token_id in vocabulary.eos_ids:
        return "<eos>"
    return repr(vocabulary.token_bytes[token_id].decode("utf-8", "replace"))


def run_compile(arguments: argparse.Namespace) -> int:
    if arguments.schema:
        return _compile_schema(arguments)
    if arguments.regex is not None:
        grammar = Grammar.from_regex(arguments.regex)
    elif arguments.ebnf:
        grammar = Grammar.from_ebnf(Path(arguments.ebnf).read_text(encoding="utf-8"))
    else:
        grammar = Grammar.from_gbnf(Path(arguments.gbnf).read_text(encoding="utf-8"))
    vocabulary = _load_vocabulary(arguments.vocabulary)
    compiled = compile_grammar(grammar, vocabulary, disk_cache=arguments.disk_cache)
    print(compiled.statistics_text())
    return 0


def _compile_schema(arguments: argparse.Namespace) -> int:
    """Compile a JSON Schema file and print the keyword report and the compile cost."""
    schema = schema_of(Path(arguments.schema).read_text(encoding="utf-8"))
    vocabulary = _load_vocabulary(arguments.vocabulary)
    compiled = compile_schema(
        schema,
        vocabulary,
        whitespace=arguments.whitespace,
        on_unsupported=arguments.on_unsupported,
        max_string_length=arguments.max_string_length,
        disk_cache=arguments.disk_cache,
    )
    print(compiled.report.to_text())
    print(compiled.compiled_grammar.statistics_text())
    return 0


def run_lint(arguments: argparse.Namespace) -> int:
    """Lint a JSON Schema file: one line per finding (or a JSON array); 1 if any is an error."""
    text = Path(arguments.schema).read_text(encoding="utf-8")
    findings = lint_schema(text, provider=arguments.provider)
    if arguments.json:
        print(json.dumps([finding.to_dict() for finding in findings], indent=2))
    elif findings:
        print("\n".join(str(finding) for finding in findings))  # severity code pointer: ...
    return 1 if any(finding.severity == "error" for finding in findings) else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="formline", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="constrained generation over a real vocabulary")
    demo.add_argument("--vocabulary", help="a GGUF file (default: the embedded SmolLM2)")
    demo.add_argument("--max-tokens", type=at_least(1, int), default=64)
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(handler=run_demo)
    compile_command = commands.add_parser("compile", help="compile a grammar, print its cost")
    source = compile_command.add_mutually_exclusive_group(required=True)
    source.add_argument("--regex")
    source.add_argument("--ebnf", help="a grammar file in formline's EBNF")
    source.add_argument("--gbnf", help="a llama.cpp GBNF grammar file")
    source.add_argument("--schema", help="a JSON Schema file: prints what each keyword became")
    compile_command.add_argument(
        "--whitespace", type=int, default=None, help="at most N whitespace bytes between tokens"
    )
    compile_command.add_argument(
        "--on-unsupported", choices=("error", "check_after", "ignore"), default="error"
    )
    compile_command.add_argument("--max-string-length", type=int, default=None)
    compile_command.add_argument("--vocabulary", help="a GGUF file (default: SmolLM2)")
    compile_command.add_argument(
        "--disk-cache", action="store_true", help="use the disk store (slower than a compile)"
    )
    compile_command.set_defaults(handler=run_compile)
    lint = commands.add_parser("lint", help="quality and portability problems of a JSON Schema")
    lint.add_argument("schema", help="a JSON Schema file")
    lint.add_argument("--json", action="store_true", help="a JSON array of findings")
    lint.add_argument("--provider", choices=("openai", "anthropic"), help="portability as errors")
    lint.set_defaults(handler=run_lint)
    register_generation(commands)
    register_serve(commands)
    register_evaluation(commands)
    register_trace(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    arguments = build_parser().parse_args(argv)
    try:
        return int(arguments.handler(arguments))
    except BackendError as error:
        print(f"formline: error: {error}", file=sys.stderr)
        return EXIT_BACKEND
    except (GrammarError, OSError, ValueError) as error:
        print(f"formline: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("formline: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
