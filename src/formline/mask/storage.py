"""Compiled grammars as bytes without pickle: numpy arrays plus a versioned JSON header.

Loading a pickle runs whatever code its author put in it, so a cache directory anyone can
write to would be a way in. This format holds only arrays (``numpy.load`` with
``allow_pickle=False``) and JSON; an entry of another format version, for another key or
vocabulary, or with an array out of range is refused (:class:`StoredGrammarError`), and the
cache rebuilds it. The masks are not stored: they are computed lazily from the automaton.
"""

from __future__ import annotations

import io
import json
import os
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from formline.errors import FormlineError
from formline.mask.compiled import CompiledGrammar, CompileStatistics
from formline.native import NativeTokenTable
from formline.parser.pushdown import PushdownAutomaton
from formline.vocab import Vocabulary

FORMAT = "formline-compiled-grammar"
FORMAT_VERSION = 2
SUFFIX = ".npz"
STALE_SECONDS = 3600  # a temporary file this old belongs to no running writer


class StoredGrammarError(FormlineError, ValueError):
    """Stored bytes that are not a compiled grammar of this version, key and vocabulary."""


def serialize(compiled: CompiledGrammar) -> bytes:
    """The compiled grammar's automaton and header as ``.npz`` bytes (zlib-compressed: a
    transition table is mostly -1). Costs O(automaton size)."""
    automaton = compiled.automaton
    header = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "key": compiled.key,
        "vocabulary": compiled.vocabulary.fingerprint(),
        "start": automaton.start,
        "stack_limit": automaton.stack_limit,
        "rule_names": automaton.rule_names,
        "seconds": compiled.compile_statistics.seconds,
    }
    buffer = io.BytesIO()
    np.savez_compressed(
        buffer,
        header=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8),
        transitions=automaton.transitions.astype(np.int32),
        accepting=automaton.accepting.astype(np.uint8),
        rule_of_state=automaton.rule_of_state.astype(np.int32),
        call_begin=automaton.call_begin,
        call_callee=automaton.call_callee,
        call_return=automaton.call_return,
    )
    return buffer.getvalue()


def deserialize(
    data: bytes, vocabulary: Vocabulary, table: NativeTokenTable, key: str | None = None
) -> CompiledGrammar:
    """A compiled grammar from :func:`serialize`'s bytes, for ``vocabulary``.

    Raises:
        StoredGrammarError: not this format or version, another key or vocabulary, or an
            array of the wrong shape or out of range (nothing in it is trusted).
    Costs O(automaton size).
    """
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
            loaded = {name: arrays[name] for name in arrays.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as error:
        raise StoredGrammarError(f"not a stored grammar: {error}") from error
    header = _header(loaded, vocabulary, key)
    automaton = _automaton(loaded, header)
    statistics = CompileStatistics(
        seconds=float(header.get("seconds", 0.0)), states=automaton.size, from_cache="disk"
    )
    return CompiledGrammar(automaton, vocabulary, table, str(header["key"]), statistics)


def _header(arrays: dict[str, np.ndarray], vocabulary: Vocabulary, key: str | None) -> Any:
    try:
        header = json.loads(arrays["header"].tobytes().decode())
    except (KeyError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise StoredGrammarError(f"the stored grammar has no readable header: {error}") from error
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise StoredGrammarError("not a formline compiled grammar")
    if header.get("version") != FORMAT_VERSION:
        raise StoredGrammarError(
            f"stored with format version {header.get('version')}, this is {FORMAT_VERSION}"
        )
    if key is not None and header.get("key") != key:
        raise StoredGrammarError("the stored grammar is for another key")
    if header.get("vocabulary") != vocabulary.fingerprint():
        raise StoredGrammarError("the stored grammar is for another vocabulary")
    return header


def _automaton(arrays: dict[str, np.ndarray], header: Any) -> PushdownAutomaton:
    """Rebuild the automaton, checking every index the kernel will follow."""
    try:
        transitions = arrays["transitions"]
        accepting = arrays["accepting"]
        rule_of_state = arrays["rule_of_state"]
        begin, callee, returning = (
            arrays[name] for name in ("call_begin", "call_callee", "call_return")
        )
        rule_names = [str(name) for name in header["rule_names"]]
        start, stack_limit = int(header["start"]), int(header["stack_limit"])
    except (KeyError, TypeError, ValueError) as error:
        raise StoredGrammarError(f"the stored grammar misses a part: {error}") from error
    size = transitions.shape[0] if transitions.ndim == 2 else -1
    checks = [
        transitions.ndim == 2 and transitions.shape[1] == 256 and size > 0,
        transitions.dtype == np.int32 and accepting.shape == (size,),
        rule_of_state.shape == (size,) and begin.shape == (size + 1,),
        callee.shape == returning.shape and callee.ndim == 1,
    ]
    if not all(checks):
        raise StoredGrammarError("the stored grammar's arrays have inconsistent shapes")
    calls = len(callee)
    in_range = [
        bool(((transitions >= -1) & (transitions < size)).all()),
        begin[0] == 0 and begin[-1] == calls and bool((np.diff(begin) >= 0).all()),
        bool(
            ((callee >= 0) & (callee < size)).all()
            and ((returning >= 0) & (returning < size)).all()
        ),
        0 <= start < size and stack_limit > 0,
        bool(((rule_of_state >= 0) & (rule_of_state < max(1, len(rule_names)))).all()),
    ]
    if not all(in_range):
        raise StoredGrammarError("the stored grammar has an index out of range")
    return PushdownAutomaton(
        transitions=np.ascontiguousarray(transitions),
        accepting=accepting.astype(bool),
        call_begin=begin,
        call_callee=callee,
        call_return=returning,
        start=start,
        rule_names=rule_names,
        rule_of_state=rule_of_state.astype(np.int32),
        stack_limit=stack_limit,
    )


def load(
    directory: Path, key: str, vocabulary: Vocabulary, table: NativeTokenTable
) -> CompiledGrammar | None:
    """The stored grammar of ``key``, or ``None`` when absent or refused (then rebuilt)."""
    path = directory / f"{key}{SUFFIX}"
    try:
        data = path.read_bytes()
        os.utime(path)  # the eviction keeps recently used entries
    except OSError:
        return None
    try:
        return deserialize(data, vocabulary, table, key)
    except StoredGrammarError:
        return None


def store(directory: Path, compiled: CompiledGrammar, limit_bytes: int) -> None:
    """Write the entry (atomically), then evict the least recently used entries past
    ``limit_bytes``. A read-only or full disk only costs the next process a recompile."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        temporary = directory / f"{compiled.key}.{os.getpid()}.tmp"
        temporary.write_bytes(serialize(compiled))
        temporary.replace(directory / f"{compiled.key}{SUFFIX}")
        evict(directory, limit_bytes)
    except OSError:
        pass


def evict(directory: Path, limit_bytes: int) -> None:
    """Delete the least recently used entries until the directory holds ``limit_bytes``;
    also files no version reads any more (the pickles of format 1, which were never
    evicted) and temporary files a crashed writer left over an hour ago."""
    now = time.time()
    for path in [*directory.glob("*.pickle"), *directory.glob("*.tmp")]:
        try:
            if path.suffix == ".pickle" or now - path.stat().st_mtime > STALE_SECONDS:
                path.unlink()
        except OSError:
            continue
    entries = []
    for path in directory.glob(f"*{SUFFIX}"):
        try:
            status = path.stat()
        except OSError:
            continue
        entries.append((status.st_mtime, status.st_size, path))
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries):
        if total <= limit_bytes:
            break
        try:
            path.unlink()
        except OSError:
            continue
        total -= size
