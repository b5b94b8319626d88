"""Compiled grammars as bytes without pickle: numpy arrays plus a versioned JSON header.

Loading a pickle runs whatever code its author put in it, so a cache directory anyone can
write to would be a way in. This format holds only arrays (``numpy.load`` with
``allow_pickle=False``) and JSON; an entry of another format version, for another key or
vocabulary, or with an array out of range is refused (:class:`StoredGrammarError`), and the
cache rebuilds it. What is stored is what the lazy automaton is built from (the flattened
IR, the called rules, the start rule and the limits: :class:`AutomatonSource`); the kernel
checks every index before it builds (``native/lazy_build.hpp``: is_well_formed). Neither the
DFA states made so far nor the masks are stored: both are made again as decoding reaches
them.
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

from formline.automata.native_build import AutomatonSource
from formline.errors import FormlineError
from formline.grammar.ir import FlatGrammar, GrammarError
from formline.mask.compiled import CompiledGrammar, CompileStatistics
from formline.native import NativeTokenTable
from formline.parser.pushdown import build_from_source
from formline.vocab import Vocabulary

FORMAT = "formline-compiled-grammar"
FORMAT_VERSION = 3  # 3: the lazy automaton's build inputs (2: the whole eager automaton)
SUFFIX = ".npz"
STALE_SECONDS = 3600  # a temporary file this old belongs to no running writer
ARRAYS = ("kind", "a", "b", "c", "children", "data", "range_pairs")  # FlatGrammar.arrays()
DTYPES = (
    ("kind", np.int8), ("a", np.int32), ("b", np.int32), ("c", np.int32),
    ("children", np.int32), ("data", np.uint8), ("range_pairs", np.int32),
    ("rule_root", np.int32), ("rule_called", np.uint8),
)  # fmt: skip


class StoredGrammarError(FormlineError, ValueError):
    """Stored bytes that are not a compiled grammar of this version, key and vocabulary."""


def serialize(compiled: CompiledGrammar) -> bytes:
    """The compiled grammar's build inputs and header as ``.npz`` bytes (zlib-compressed).
    Costs O(distinct IR nodes).

    Raises:
        ValueError: the automaton was not built lazily from a grammar (no source to store).
    """
    source = compiled.automaton.source
    if source is None:
        raise ValueError("only an automaton built from a grammar can be stored")
    flat = source.flat
    header = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "key": compiled.key,
        "vocabulary": compiled.vocabulary.fingerprint(),
        "rule_names": flat.rule_names,
        "start": source.start,
        "limits": [source.nfa_state_limit, source.dfa_state_limit, source.stack_limit],
        "seconds": compiled.compile_statistics.seconds,
    }
    buffer = io.BytesIO()
    arrays: dict[str, Any] = dict(zip(ARRAYS, flat.arrays(), strict=True))
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    arrays["rule_root"] = flat.rule_root
    arrays["rule_called"] = source.rule_called
    np.savez_compressed(buffer, **arrays)
    return buffer.getvalue()


def deserialize(
    data: bytes, vocabulary: Vocabulary, table: NativeTokenTable, key: str | None = None
) -> CompiledGrammar:
    """A compiled grammar from :func:`serialize`'s bytes, for ``vocabulary``.

    Raises:
        StoredGrammarError: not this format or version, another key or vocabulary, an array
            of the wrong type or shape, or an index out of range (nothing in it is trusted).
    Costs the lazy build (the start rule's NFA, or every rule's where the others cannot wait).
    """
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
            loaded = {name: arrays[name] for name in arrays.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as error:
        raise StoredGrammarError(f"not a stored grammar: {error}") from error
    header = _header(loaded, vocabulary, key)
    try:
        automaton = build_from_source(_source(loaded, header))
    except (GrammarError, ValueError, TypeError) as error:
        raise StoredGrammarError(f"the stored grammar does not build: {error}") from error
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


def _source(arrays: dict[str, np.ndarray], header: Any) -> AutomatonSource:
    """The build inputs, their types and shapes checked (the kernel checks the indices)."""
    try:
        rule_names = [str(name) for name in header["rule_names"]]
        start = int(header["start"])
        nfa_limit, dfa_limit, stack_limit = (int(limit) for limit in header["limits"])
        parts = {name: arrays[name] for name in (*ARRAYS, "rule_root", "rule_called")}
    except (KeyError, TypeError, ValueError) as error:
        raise StoredGrammarError(f"the stored grammar misses a part: {error}") from error
    nodes = parts["kind"].shape[0] if parts["kind"].ndim == 1 else -1
    checks = [
        all(parts[name].dtype == dtype and parts[name].ndim == 1 for name, dtype in DTYPES),
        nodes > 0 and all(parts[name].shape == (nodes,) for name in ("a", "b", "c")),
        parts["rule_root"].shape == parts["rule_called"].shape == (len(rule_names),),
        parts["range_pairs"].shape[0] % 2 == 0 and 0 <= start < len(rule_names),
        min(nfa_limit, dfa_limit, stack_limit) > 0 and dfa_limit < 1 << 31,
    ]
    if not all(checks):
        raise StoredGrammarError("the stored grammar's arrays have inconsistent shapes")
    flat = FlatGrammar(
        kind=parts["kind"],
        a=parts["a"],
        b=parts["b"],
        c=parts["c"],
        children=parts["children"],
        data=parts["data"],
        range_pairs=parts["range_pairs"],
        rule_names=rule_names,
        rule_root=parts["rule_root"],
        roots={name: int(root) for name, root in zip(rule_names, parts["rule_root"], strict=True)},
    )
    return AutomatonSource(flat, parts["rule_called"], start, nfa_limit, dfa_limit, stack_limit)


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
