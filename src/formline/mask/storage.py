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

Nothing in an entry is trusted. A file that is not a regular file, is over
:data:`MAX_ENTRY_BYTES`, holds other members or members whose arrays would unpack past
:data:`MAX_UNPACKED_BYTES` is refused before anything is unpacked (a 3 MB entry unpacked a
3 GiB member; a FIFO named as an entry hung the compile); the cache's own load also compares
the entry with the build inputs of the grammar it asked for, so an entry copied under another
key is refused (it was used: ``[a-z]{1,5}`` accepted ``7``), and the limits are the
caller's. A refused entry is deleted, so it costs one rebuild, not one per compile.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import re
import stat
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from formline.automata.native_build import AutomatonSource
from formline.errors import FormlineError
from formline.grammar.budget import (
    DEFAULT_DFA_STATE_LIMIT,
    DEFAULT_NFA_STATE_LIMIT,
    DEFAULT_STACK_LIMIT,
    CompileLimitError,
    Deadline,
)
from formline.grammar.ir import FlatGrammar
from formline.mask.compiled import CompiledGrammar, CompileStatistics
from formline.native import NativeTokenTable
from formline.parser.pushdown import build_from_source
from formline.vocab import Vocabulary

FORMAT = "formline-compiled-grammar"
FORMAT_VERSION = 3  # 3: the lazy automaton's build inputs (2: the whole eager automaton)
SUFFIX = ".npz"
TEMPORARY_SUFFIX = ".tmp"
# The names the cache writes: an entry, a pickle of format 1, a writer's temporary file.
CACHE_NAME = re.compile(r"[0-9a-f]{64}(?P<kind>\.npz|\.pickle|(?:\.[A-Za-z0-9_]+)+\.tmp)")
STALE_SECONDS = 3600  # a temporary file this old belongs to no running writer
ARRAYS = ("kind", "a", "b", "c", "children", "data", "range_pairs")  # FlatGrammar.arrays()
DTYPES = (
    ("kind", np.int8), ("a", np.int32), ("b", np.int32), ("c", np.int32),
    ("children", np.int32), ("data", np.uint8), ("range_pairs", np.int32),
    ("rule_root", np.int32), ("rule_called", np.uint8),
)  # fmt: skip
MEMBERS = (*ARRAYS, "header", "rule_root", "rule_called")
# MaskBench's largest grammars store 0.1-0.3 MB; these bounds are hundreds of times that.
MAX_ENTRY_BYTES = 64 << 20
MAX_UNPACKED_BYTES = 256 << 20
DEFAULT_LIMITS = (DEFAULT_NFA_STATE_LIMIT, DEFAULT_DFA_STATE_LIMIT, DEFAULT_STACK_LIMIT)


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
    data: bytes,
    vocabulary: Vocabulary,
    table: NativeTokenTable,
    key: str | None = None,
    expected: AutomatonSource | None = None,
    deadline: Deadline | None = None,
) -> CompiledGrammar:
    """A compiled grammar from :func:`serialize`'s bytes, for ``vocabulary``: the one whose
    build inputs are ``expected`` when given (the limits then are its), else one whose limits
    are at most :class:`~formline.CompileBudget`'s defaults.

    Raises:
        StoredGrammarError: not this format or version, another key, vocabulary or grammar,
            an array of the wrong type or shape, members that would unpack past
            :data:`MAX_UNPACKED_BYTES`, or an index out of range (nothing in it is trusted).
        CompileLimitError: ``deadline`` passed while building.
    Costs the members' unpacking and the lazy build (the start rule's NFA, or every rule's
    where the others cannot wait).
    """
    try:
        loaded = _members(data)
        header = _header(loaded, vocabulary, key)
        source = _source(loaded, header)
        _check_source(source, expected)
        automaton = build_from_source(source, deadline)
        seconds = float(header.get("seconds", 0.0))
    except (StoredGrammarError, CompileLimitError):
        raise
    except Exception as error:  # a crafted entry is refused whatever it breaks
        raise StoredGrammarError(f"not a usable stored grammar: {error!r}") from error
    statistics = CompileStatistics(seconds=seconds, states=automaton.size, from_cache="disk")
    return CompiledGrammar(automaton, vocabulary, table, str(header["key"]), statistics)


def _members(data: bytes) -> dict[str, np.ndarray]:
    """The entry's arrays, each one's size checked against its member's before it is read
    (a header claiming 2**45 elements in a 2 KB member raised MemoryError)."""
    loaded: dict[str, np.ndarray] = {}
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        members = {info.filename: info for info in archive.infolist()}
        if sorted(members) != sorted(f"{name}.npy" for name in MEMBERS):
            raise StoredGrammarError(f"the stored grammar holds {sorted(members)}")
        if sum(info.file_size for info in members.values()) > MAX_UNPACKED_BYTES:
            raise StoredGrammarError("the stored grammar unpacks past its bound")
        for name in MEMBERS:
            info = members[f"{name}.npy"]
            with archive.open(info) as member:
                version = np.lib.format.read_magic(member)
                read = (np.lib.format.read_array_header_1_0, np.lib.format.read_array_header_2_0)
                shape, _, dtype = read[version[0] - 1](member)
                if dtype.hasobject or int(np.prod(shape)) * dtype.itemsize > info.file_size:
                    raise StoredGrammarError(f"member {name} claims more than it holds")
            with archive.open(info) as member:
                loaded[name] = np.lib.format.read_array(member, allow_pickle=False)
    return loaded


def _check_source(source: AutomatonSource, expected: AutomatonSource | None) -> None:
    """Refuse a source that is not ``expected`` (or, without it, over the default limits)."""
    limits = (source.nfa_state_limit, source.dfa_state_limit, source.stack_limit)
    if expected is None:
        if any(given > most for given, most in zip(limits, DEFAULT_LIMITS, strict=True)):
            raise StoredGrammarError(f"the stored grammar's limits {limits} are over the defaults")
        return
    wanted, found = expected.flat, source.flat
    same = (
        limits == (expected.nfa_state_limit, expected.dfa_state_limit, expected.stack_limit)
        and source.start == expected.start
        and found.rule_names == wanted.rule_names
        and np.array_equal(found.rule_root, wanted.rule_root)
        and np.array_equal(source.rule_called, expected.rule_called)
        and all(map(np.array_equal, found.arrays(), wanted.arrays()))
    )
    if not same:
        raise StoredGrammarError("the stored grammar is not the one its key names")


def _header(arrays: dict[str, np.ndarray], vocabulary: Vocabulary, key: str | None) -> Any:
    header = json.loads(arrays["header"].tobytes().decode())
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
    rule_names = [str(name) for name in header["rule_names"]]
    start = int(header["start"])
    nfa_limit, dfa_limit, stack_limit = (int(limit) for limit in header["limits"])
    parts = {name: arrays[name] for name in (*ARRAYS, "rule_root", "rule_called")}
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
    directory: Path,
    key: str,
    vocabulary: Vocabulary,
    table: NativeTokenTable,
    expected: AutomatonSource | None = None,
    deadline: Deadline | None = None,
) -> CompiledGrammar | None:
    """The stored grammar of ``key`` (whose build inputs must be ``expected``), or ``None``
    when absent or refused (then deleted, and rebuilt by the caller).

    Raises:
        CompileLimitError: ``deadline`` passed while building.
    Costs one read of the file (at most :data:`MAX_ENTRY_BYTES`) and :func:`deserialize`."""
    path = directory / f"{key}{SUFFIX}"
    try:
        data = _read_entry(path)
    except OSError:
        return None
    if data is None:
        _remove(path)  # a FIFO was opened and waited on for ever; /dev/zero read 3.7 GB
        return None
    try:
        compiled = deserialize(data, vocabulary, table, key, expected, deadline)
    except StoredGrammarError:
        _remove(path)
        return None
    # The eviction keeps recently used entries; a read-only store is still read (it was
    # treated as a miss).
    with contextlib.suppress(OSError):
        os.utime(path)
    return compiled


def _read_entry(path: Path) -> bytes | None:
    """The bytes of the regular file at ``path``, or ``None`` for anything else (a FIFO, a
    device, a file over :data:`MAX_ENTRY_BYTES`). Opened once, not following a symbolic
    link, without blocking, and judged by its descriptor: a check of the path before the
    read could be raced (an entry swapped for a FIFO between the two hung ``load``).

    Raises:
        OSError: the file cannot be opened or read (a symbolic link: ELOOP)."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(descriptor, "rb") as file:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode) or status.st_size > MAX_ENTRY_BYTES:
            return None
        data = file.read(MAX_ENTRY_BYTES + 1)
    return data if len(data) <= MAX_ENTRY_BYTES else None


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def store(directory: Path, compiled: CompiledGrammar, limit_bytes: int) -> None:
    """Write the entry (atomically), then evict the least recently used entries past
    ``limit_bytes``. A read-only or full disk only costs the next process a recompile."""
    temporary: Path | None = None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        # A new file of a name no one could plant first: a predictable name was followed
        # through a symbolic link planted under it, and the entry overwrote its target.
        descriptor, name = tempfile.mkstemp(
            suffix=TEMPORARY_SUFFIX, prefix=f"{compiled.key}.", dir=directory
        )
        temporary = Path(name)
        # mkstemp's 0600 kept a cache folder shared between users or containers unreadable
        # to all but its writer (each recompiled): the mode open() would give, as before.
        os.fchmod(descriptor, 0o666 & ~_umask())
        with os.fdopen(descriptor, "wb") as file:
            file.write(serialize(compiled))
        temporary.replace(directory / f"{compiled.key}{SUFFIX}")
        evict(directory, limit_bytes)
    except OSError:
        if temporary is not None:
            _remove(temporary)  # a full disk left the partial file for an hour


@functools.cache
def _umask() -> int:
    """The process's umask, read without setting it (``os.umask`` sets it, for every
    thread at once); 0o022 where /proc does not say."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


def evict(directory: Path, limit_bytes: int) -> None:
    """Delete the least recently used entries until the directory holds ``limit_bytes``;
    also files no version reads any more (the pickles of format 1, which were never
    evicted) and temporary files a crashed writer left over an hour ago. Only names the
    cache writes are touched (:data:`CACHE_NAME`): a ``disk_cache`` folder shared with
    other files lost them all."""
    now = time.time()
    entries = []
    for path in directory.iterdir():
        match = CACHE_NAME.fullmatch(path.name)
        if match is None:
            continue
        if match["kind"] != SUFFIX:
            try:
                if match["kind"] == ".pickle" or now - path.stat().st_mtime > STALE_SECONDS:
                    path.unlink()
            except OSError:
                pass
            continue
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
