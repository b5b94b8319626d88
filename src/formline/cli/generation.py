"""``formline generate`` and ``formline extract``: real models from the command line.

Exit codes scripts can rely on: 0 ok; 2 bad input (usage, a file, a schema); 3 the model
or backend failed; 4 the output was cut off at ``--max-tokens``; 5 the output broke a
constraint the grammar could not enforce (the after-check). ``extract`` exits 0 when every
line was written, whatever each line's outcome (each line says it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from formline.backends.base import BackendError
from formline.cli.arguments import at_least, probability
from formline.constraint import Choice, Regex
from formline.jsonl import mend_torn_end, read_numbered
from formline.pipeline.extract import Failed, extract
from formline.pipeline.generate import (
    DEFAULT_DESCRIBE,
    DEFAULT_NUMBERS,
    DEFAULT_THINK,
    DEFAULT_WHITESPACE,
    InvalidOutput,
    TruncatedOutput,
    backend_for,
    generate,
)
from formline.schema import schema_of

EXIT_BACKEND = 3
EXIT_TRUNCATED = 4
EXIT_INVALID = 5


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """``--model``, ``--backend`` and the sampling flags shared by the model commands."""
    parser.add_argument("--model", help="a GGUF file or HF model directory (default: SmolLM2)")
    parser.add_argument("--backend", default="llama_cpp", choices=("llama_cpp", "transformers"))
    parser.add_argument("--max-tokens", type=at_least(1, int), default=256)
    parser.add_argument("--temperature", type=at_least(0.0, float), default=0.0)
    parser.add_argument("--top-p", type=probability, default=1.0, help="in (0, 1]")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--free", action="store_true", help="no mask (for comparison)")
    parser.add_argument(
        "--describe-schema",
        choices=("none", "auto", "schema", "fields"),
        default=_style(DEFAULT_DESCRIBE),
        help="how the prompt describes a schema (default: %(default)s, chosen by measurement)",
    )
    parser.add_argument(
        "--no-describe-schema", action="store_true", help="same as --describe-schema none"
    )
    parser.add_argument(
        "--whitespace", type=int, default=DEFAULT_WHITESPACE,
        help="JSON whitespace bytes allowed between tokens (default: %(default)s; -1: compact)",
    )  # fmt: skip
    parser.add_argument(
        "--numbers", choices=("strict", "tolerant"), default=DEFAULT_NUMBERS,
        help="tolerant: a number may be spelled ('thirty-six') and is coerced after",
    )  # fmt: skip
    parser.add_argument(
        "--think", type=int, default=DEFAULT_THINK,
        help="free tokens the model may write before the answer (kept apart from it)",
    )  # fmt: skip
    parser.add_argument(
        "--verbatim", action="store_true",
        help="plain strings, numbers and dates only as the text writes them (extract's default)",
    )  # fmt: skip


def _style(describe: bool | str) -> str:
    if describe is True:
        return "schema"
    return "none" if describe is False else str(describe)


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--schema", help="a JSON Schema file")
    output.add_argument("--regex", help="a regular expression the output must match")
    output.add_argument("--choices", help="comma-separated options; the output is one of them")


def output_spec(arguments: argparse.Namespace) -> Any:
    """The ``output=`` of :func:`formline.generate` from the command-line flags (``None``
    where none is given). An empty ``--regex ''`` is the empty language's text, not no
    constraint (it generated free text).

    Raises:
        SystemExit: ``--choices`` with an empty option (argparse's usage error)."""
    if getattr(arguments, "schema", None) is not None:
        return schema_of(Path(arguments.schema).read_text(encoding="utf-8"))
    if getattr(arguments, "regex", None) is not None:
        return Regex(arguments.regex)
    if getattr(arguments, "choices", None) is not None:
        options = [option.strip() for option in arguments.choices.split(",")]
        if not all(options):  # "a,,b" added "" silently, and "" allowed free text
            raise SystemExit(f"formline: --choices {arguments.choices!r} has an empty option")
        return Choice(options)
    return None


def _backend(arguments: argparse.Namespace) -> Any:
    return backend_for(arguments.model, arguments.backend)


def _generate(arguments: argparse.Namespace, prompt: str, output: Any, backend: Any) -> Any:
    return generate(
        prompt, output, backend, max_tokens=arguments.max_tokens, **_sampling(arguments)
    )


def _sampling(arguments: argparse.Namespace) -> dict[str, Any]:
    """The model flags as :func:`formline.generate`'s options (``extract`` passes them on)."""
    return {
        "temperature": arguments.temperature,
        "top_p": arguments.top_p,
        "seed": arguments.seed,
        "describe_schema": _describe(arguments),
        "free": arguments.free,
        "whitespace": None if arguments.whitespace < 0 else arguments.whitespace,
        "numbers": arguments.numbers,
        "think": arguments.think,
        "verbatim": arguments.verbatim,
    }


def _describe(arguments: argparse.Namespace) -> bool | str:
    if arguments.no_describe_schema or arguments.describe_schema == "none":
        return False
    return str(arguments.describe_schema)


def run_generate(arguments: argparse.Namespace) -> int:
    """Print the value (JSON for a schema, the text otherwise); exit 4/5 on a bad output."""
    output = output_spec(arguments)
    backend = _backend(arguments)
    result = _generate(arguments, arguments.prompt, output, backend)
    if arguments.verbose:  # on exits 4 and 5 too, where the usage says most
        print(json.dumps({"usage": result.usage, "timings": result.timings}), file=sys.stderr)
    try:
        value = result.value
    except TruncatedOutput as error:
        print(result.text)
        print(f"formline: error: {error}", file=sys.stderr)
        return EXIT_TRUNCATED
    except InvalidOutput as error:
        print(result.text)
        print(f"formline: error: {error}", file=sys.stderr)
        return EXIT_INVALID
    print(json.dumps(value, ensure_ascii=False) if result.kind != "text" else value)
    return 0


def run_extract(arguments: argparse.Namespace) -> int:
    """One JSON line per input line; lines already in the output (by id, or by line number
    for a row without one, and schema) are skipped, so an interrupted run resumes where it
    stopped.

    Raises:
        ValueError: an input line is not a JSON object with a string ``text`` (and, with
            ``--schema DIR``, a ``schema``), or two lines share an id and schema.
    """
    input_path = Path(arguments.input)
    rows = _input_rows(input_path, Path(arguments.schema).is_dir())
    output_path = Path(arguments.output)
    done = {_key(record) for record in _finished_records(output_path)}
    pending = [row for row in rows if _key(row) not in done]
    schemas: dict[str, Any] = {}
    for row in pending:  # every schema read and checked before the model loads
        _row_schema(arguments, row, schemas)
    backend = _backend(arguments)
    failed = 0
    with output_path.open("a", encoding="utf-8") as sink:
        for row in tqdm(pending, desc="extract", unit="doc", file=sys.stderr, disable=None):
            schema = _row_schema(arguments, row, schemas)
            try:
                record = _extract_row(arguments, row, schema, backend)
            except BackendError as error:
                # A document the model cannot take (longer than its context) is that row's
                # error: it ended the whole run, and every resume met it again.
                record = {"id": row.get("id"), "value": None, "error": str(error)}
                failed += 1
            record.update(
                line=row["line"], **({"schema": row["schema"]} if "schema" in row else {})
            )
            sink.write(json.dumps(record) + "\n")
            sink.flush()
    already = len(rows) - len(pending)
    failures = f" ({failed} with a model error)" if failed else ""
    print(f"formline: {len(pending)} written{failures}, {already} already there", file=sys.stderr)
    return 0


def _finished_records(path: Path) -> list[Any]:
    """The records an earlier run wrote to ``path`` (none if it does not exist), its torn
    last line cut off with a word on stderr (:func:`formline.jsonl.mend_torn_end`).

    Raises:
        ValueError: ``path:line`` of another line that is not JSON.
    """
    if not path.exists():
        return []
    cut = mend_torn_end(path)
    if cut:
        print(f"formline: {path}: dropped a torn last line ({cut} bytes)", file=sys.stderr)
    return _read_jsonl(path)


def _input_rows(path: Path, needs_schema: bool) -> list[dict[str, Any]]:
    """The input's rows, each with its ``line`` number, checked before the model loads.

    Raises:
        ValueError: naming the file and line of a row that is not an object, has no string
            ``text`` (or, when ``needs_schema``, no ``schema``), or repeats another's key.
    """
    rows: list[dict[str, Any]] = []
    seen: dict[tuple[str, Any], int] = {}
    for number, row in read_numbered(path):
        where = f"{path}:{number}"
        if not isinstance(row, dict):
            raise ValueError(f"{where}: a line must be a JSON object, not {type(row).__name__}")
        if not isinstance(row.get("text"), str):
            raise ValueError(f'{where}: no "text" string')
        if needs_schema and not isinstance(row.get("schema"), str):
            raise ValueError(f'{where}: no "schema" (a file name in the --schema folder)')
        row = {**row, "line": number}
        key = _key(row)
        if key in seen:
            raise ValueError(f"{where}: id {row.get('id')!r} is already on line {seen[key]}")
        seen[key] = number
        rows.append(row)
    return rows


def _key(row: dict[str, Any]) -> tuple[str, Any]:
    """What identifies a row (and its output record): its id, else its line; and schema."""
    identity, schema = row.get("id"), row.get("schema")
    # Only a file name is a schema (--schema DIR): another value there is ignored, and may
    # not hash (an object).
    schema = schema if isinstance(schema, str) else None
    return (f"line {row.get('line')}" if identity is None else repr(identity), schema)


def _row_schema(arguments: argparse.Namespace, row: dict[str, Any], cache: dict[str, Any]) -> Any:
    """The batch's schema, or (with ``--schema DIR``) the file the row's ``schema`` names."""
    path = Path(arguments.schema)
    if path.is_dir():
        path = path / str(row["schema"])
    key = str(path)
    if key not in cache:
        try:
            cache[key] = schema_of(path.read_text(encoding="utf-8"))
        except ValueError as error:  # SchemaError included: say which file, and for whom
            raise ValueError(f"{path} (line {row['line']} of the input): {error}") from error
    return cache[key]


def _extract_row(
    arguments: argparse.Namespace, row: dict[str, Any], schema: Any, backend: Any
) -> dict[str, Any]:
    if arguments.repair > 1 or arguments.ground:  # grounding is the loop's check
        return _repair_row(arguments, row, schema, backend)
    prompt = f"{row['instruction']}\n\n{row['text']}" if row.get("instruction") else row["text"]
    started = time.perf_counter()
    result = _generate(arguments, prompt, schema, backend)
    record: dict[str, Any] = {"id": row.get("id"), "value": None, "text": result.text}
    try:
        record["value"] = result.value
    except (TruncatedOutput, InvalidOutput) as error:
        record["error"] = str(error)
    record.update(
        finish_reason=result.finish_reason,
        errors=result.errors,
        usage=result.usage,
        timings={**result.timings, "total_seconds": time.perf_counter() - started},
    )
    return record


def _repair_row(
    arguments: argparse.Namespace, row: dict[str, Any], schema: Any, backend: Any
) -> dict[str, Any]:
    """One row through :func:`formline.extract` (the repair loop, ``--repair`` attempts, with
    ``--ground`` even for one), with every model flag."""
    outcome = extract(
        row["text"],
        schema,
        backend,
        instruction=row.get("instruction"),
        ground=arguments.ground,
        max_attempts=arguments.repair,
        max_tokens=arguments.max_tokens,
        **_sampling(arguments),
    )
    last = outcome.attempts[-1]
    return {
        "id": row.get("id"),
        "value": None if isinstance(outcome, Failed) else outcome.value,
        "text": last.text,
        "error": outcome.reason if isinstance(outcome, Failed) else None,
        "finish_reason": last.finish_reason,
        "errors": last.errors,
        "attempts": len(outcome.attempts),
        "usage": outcome.usage,
        "timings": {"total_seconds": outcome.seconds},
    }


def _read_jsonl(path: Path) -> list[Any]:
    return [row for _, row in read_numbered(path)]


def register(commands: Any) -> None:
    """Add ``generate`` and ``extract`` to the CLI's sub-commands."""
    generate = commands.add_parser("generate", help="generate a typed value with a real model")
    generate.add_argument("prompt", help="the text or question")
    add_output_arguments(generate)
    add_model_arguments(generate)
    generate.add_argument("--verbose", action="store_true", help="usage and timings on stderr")
    generate.set_defaults(handler=run_generate)
    extract = commands.add_parser("extract", help="run a JSONL batch (resumable)")
    extract.add_argument("--schema", required=True, help="a schema file, or a folder of them")
    extract.add_argument("--input", required=True, help="JSONL: id, text, [instruction, schema]")
    extract.add_argument("--output", required=True, help="JSONL, appended to (resumable)")
    extract.add_argument(
        "--repair",
        type=at_least(1, int),
        default=1,
        help="attempts of the repair loop (1: no repair)",
    )  # with --ground, one attempt still runs the loop: it is what checks the values
    extract.add_argument("--ground", action="store_true", help="check values against the text")
    add_model_arguments(extract)
    extract.add_argument(
        "--no-verbatim", dest="verbatim", action="store_false",
        help="let plain strings, numbers and dates be other than the text writes them",
    )  # fmt: skip
    # Extraction copies values by default, as formline.extract does (docs/results/verbatim/).
    extract.set_defaults(handler=run_extract, verbatim=True)
