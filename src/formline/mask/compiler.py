"""The compile cache: one object that owns every cache between a grammar and its masks.

:class:`CompileCache` holds the vocabularies' token tries, the compiled grammars (an LRU
bounded in bytes), derived values of higher layers (the schema-to-grammar results, through
:meth:`CompileCache.memoize`) and the disk store, behind one lock that is never held while
something compiles. Two threads compiling different grammars run side by side; two asking for
the same one compile it once (the second waits for the first). :class:`formline.GrammarCompiler`
is the public face; ``compile_grammar`` here is a thin wrapper over the default cache.
"""

from __future__ import annotations

import hashlib
import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from formline.grammar.budget import CompileBudget, Deadline
from formline.grammar.ir import Grammar, GrammarError
from formline.mask import storage
from formline.mask.compiled import CompiledGrammar, CompileStatistics, token_table
from formline.native import NativeTokenTable
from formline.parser.pushdown import build_from_source, grammar_source
from formline.vocab import Vocabulary

CACHE_FORMAT_VERSION = "2"
DEFAULT_CACHE_LIMIT_BYTES = 1 << 30  # compiled grammars in memory, masks included
DEFAULT_DISK_LIMIT_BYTES = 256 << 20
# A cache hit measures the entries again at most this often: a full count of the 300
# MaskBench schemas' grammars costs milliseconds, against 0.3 ms for a cached compile.
RECOUNT_SECONDS = 1.0
DerivedValue = TypeVar("DerivedValue")


def default_disk_limit_bytes() -> int:
    """``$FORMLINE_DISK_CACHE_MB`` megabytes, or 256 MB: the default caches' disk store.

    Raises:
        ValueError: the variable is set but not a non-negative integer.
    """
    configured = os.environ.get("FORMLINE_DISK_CACHE_MB")
    if configured is None:
        return DEFAULT_DISK_LIMIT_BYTES
    if not configured.strip().isdigit():
        raise ValueError(f"FORMLINE_DISK_CACHE_MB must be a whole number, not {configured!r}")
    return int(configured) << 20


def default_cache_directory() -> Path:
    """``$FORMLINE_CACHE_DIR`` or ``~/.cache/formline``."""
    configured = os.environ.get("FORMLINE_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "formline"


class CompileCache:
    """Compiled grammars and everything derived on the way, shared between threads.

    Args:
        cache_limit_bytes: memory for compiled grammars (their automata, per-state walks and
            mask caches, measured when stored); past it the least recently used are dropped.
        disk_cache: ``False`` (default) for none, ``True`` for
            ``default_cache_directory()/compiled``, a path for another. Entries are arrays
            plus JSON (:mod:`formline.mask.storage`).
        disk_limit_bytes: size of the disk store; past it the least recently used go.
    """

    def __init__(
        self,
        cache_limit_bytes: int = DEFAULT_CACHE_LIMIT_BYTES,
        disk_cache: bool | str | os.PathLike[str] = False,
        disk_limit_bytes: int = DEFAULT_DISK_LIMIT_BYTES,
    ):
        if cache_limit_bytes < 0 or disk_limit_bytes < 0:
            raise ValueError("cache limits must not be negative")
        self.cache_limit_bytes = cache_limit_bytes
        self.disk_cache = disk_cache
        self.disk_limit_bytes = disk_limit_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[Any, tuple[Any, Callable[[Any], int]]] = OrderedDict()
        self._bytes = 0  # the entries' sizes as last measured (_sizes)
        self._sizes: dict[Any, int] = {}
        self._stores_since_count = 0
        # Entries grow after they are stored (masks), and a server with a fixed set of
        # schemas stores nothing new: a cache hit counts them again once this old.
        self._counted_at = time.monotonic()
        self._building: dict[Any, threading.Event] = {}

    def token_table(self, vocabulary: Vocabulary) -> NativeTokenTable:
        """The vocabulary's token trie (built once per vocabulary, about 0.1 s for 128k)."""
        fingerprint = vocabulary.fingerprint()
        return self.memoize(("table", fingerprint), lambda: token_table(vocabulary), lambda _: 0)

    def memoize(
        self,
        key: Any,
        build: Callable[[], DerivedValue],
        size_of: Callable[[DerivedValue], int] = lambda _: 1024,
        deadline: Deadline | None = None,
    ) -> DerivedValue:
        """``build()``'s value for ``key``, computed once: a second caller for the same key
        waits for the first (until its own ``deadline``), callers for other keys do not.
        ``build`` runs without the lock; if it raises, nothing is stored and the error
        reaches its caller.

        Raises:
            CompileLimitError: ``deadline`` passed while waiting for another caller's build
                (a caller with a 0.5 s budget waited 5 s for one under 30 s).
        """
        while True:
            with self._lock:
                found = self._entries.get(key)
                if found is not None:
                    self._entries.move_to_end(key)
                    if time.monotonic() - self._counted_at > RECOUNT_SECONDS:
                        self._count_and_evict(keep=key)
                    return found[0]
                waiter = self._building.get(key)
                owner = waiter is None
                if owner:
                    waiter = self._building[key] = threading.Event()
            assert waiter is not None
            if not owner:
                if deadline is None or not math.isfinite(deadline.at):
                    waiter.wait()
                elif not waiter.wait(max(0.0, deadline.at - time.monotonic())):
                    deadline.check("waiting for the same compile on another thread")
                continue
            try:
                value = build()
                self._store(key, value, size_of)  # before the waiters wake: they find it
            finally:
                with self._lock:
                    del self._building[key]
                waiter.set()
            return value

    def _store(self, key: Any, value: Any, size_of: Callable[[Any], int]) -> None:
        """Insert, then drop the least recently used entries past the byte limit.

        Entries grow after they are stored (a compiled grammar's masks), so every size is
        measured again in a full count: at a store that takes the counted total past the
        limit, and at least once every ``entries / 8`` stores (every store while there are 8
        or fewer). Counting every entry at every store made each compile O(entries): with
        the 300 MaskBench schemas cached, 0.29 -> 0.88 ms a compile (median of the last 100).
        """
        with self._lock:
            size = size_of(value)
            self._bytes += size - self._sizes.get(key, 0)
            self._entries[key] = (value, size_of)
            self._sizes[key] = size
            self._stores_since_count += 1
            is_due = 8 * self._stores_since_count >= len(self._entries)
            if self._bytes <= self.cache_limit_bytes and not is_due:
                return
            self._count_and_evict(keep=key)

    def _count_and_evict(self, keep: Any) -> None:
        """Measure every entry again, then drop the least recently used past the byte limit
        (lock held). ``keep`` (the entry just stored or read) and the vocabularies' token
        tries stay: a trie (13 MB for 128k tokens, counted as nothing) was evicted with the
        grammars and built again for every compile under a small limit (0.1 s each)."""
        self._sizes = {entry: measure(kept) for entry, (kept, measure) in self._entries.items()}
        self._bytes = sum(self._sizes.values())
        self._stores_since_count = 0
        self._counted_at = time.monotonic()
        if self._bytes <= self.cache_limit_bytes:
            return
        for dropped in [entry for entry in self._entries if entry != keep]:
            if self._bytes <= self.cache_limit_bytes:
                break
            if isinstance(dropped, tuple) and dropped[:1] == ("table",):
                continue
            del self._entries[dropped]
            self._bytes -= self._sizes.pop(dropped)

    def compile(
        self,
        grammar: Grammar,
        vocabulary: Vocabulary,
        budget: CompileBudget | None = None,
        deadline: Deadline | None = None,
    ) -> CompiledGrammar:
        """``grammar`` bound to ``vocabulary``: see :func:`compile_grammar`. ``deadline``:
        one already running for a larger compile (a schema's), else ``budget`` starts one."""
        budget = budget or CompileBudget()
        limits = budget.state_limits()
        key = cache_key(grammar, vocabulary, limits)
        running = deadline or budget.start()
        for _ in range(2):
            compiled = self.memoize(
                ("grammar", key),
                lambda: self._build(grammar, vocabulary, limits, key, running),
                CompiledGrammar.memory_bytes,
                running,
            )
            if not compiled.automaton.native.failed:
                break
            # Its DFA met the state limit while decoding: every later matcher of it would
            # fail too (request 74 of a series failed, and every one after it); rebuilt.
            self._forget(("grammar", key), compiled)
        return compiled

    def _forget(self, key: Any, value: Any) -> None:
        """Drop ``key``'s entry if it is still ``value``."""
        with self._lock:
            found = self._entries.get(key)
            if found is not None and found[0] is value:
                del self._entries[key]
                self._bytes -= self._sizes.pop(key, 0)

    def _build(
        self,
        grammar: Grammar,
        vocabulary: Vocabulary,
        limits: tuple[int, int, int],
        key: str,
        deadline: Deadline,
    ) -> CompiledGrammar:
        started = time.perf_counter()
        table = self.token_table(vocabulary)
        directory = self.directory()
        source = grammar_source(grammar, *limits)
        if directory:  # an entry is used only when it holds this source (nothing trusted)
            compiled = storage.load(directory, key, vocabulary, table, source, deadline)
            if compiled is not None:
                compiled.compile_statistics.seconds = time.perf_counter() - started
                check_first_mask(compiled)
                return compiled
        automaton = build_from_source(source, deadline)
        statistics = CompileStatistics(seconds=time.perf_counter() - started, states=automaton.size)
        compiled = CompiledGrammar(automaton, vocabulary, table, key, statistics)
        check_first_mask(compiled)
        if directory:
            storage.store(directory, compiled, self.disk_limit_bytes)
        return compiled

    def directory(self) -> Path | None:
        """The disk store's folder, or ``None`` without one."""
        if self.disk_cache is False:
            return None
        if self.disk_cache is True:
            return default_cache_directory() / "compiled"
        return Path(self.disk_cache)

    def clear(self, token_tables: bool = False) -> None:
        """Forget the compiled grammars and derived values in memory; the vocabularies'
        token tries too with ``token_tables`` (the disk store stays)."""
        with self._lock:
            for key in list(self._entries):
                if token_tables or key[0] != "table":
                    del self._entries[key]
                    self._sizes.pop(key, None)
            self._bytes = sum(self._sizes.values())

    def memory_bytes(self) -> int:
        """Bytes the entries hold now."""
        with self._lock:
            return sum(measure(stored) for stored, measure in self._entries.values())


def cache_key(grammar: Grammar, vocabulary: Vocabulary, limits: tuple[int, ...]) -> str:
    """SHA-256 of the format version, the grammar, the vocabulary and the limits."""
    digest = hashlib.sha256()
    for part in (
        CACHE_FORMAT_VERSION,
        grammar.fingerprint(),
        vocabulary.fingerprint(),
        repr(limits),
    ):
        digest.update(part.encode() + b"\x00")
    return digest.hexdigest()


_default_caches: dict[Any, CompileCache] = {}
_default_lock = threading.Lock()


def default_cache(disk_cache: bool | str | os.PathLike[str] = False) -> CompileCache:
    """The process-wide cache for a disk setting (one per setting, created on first use)."""
    setting = disk_cache if isinstance(disk_cache, bool) else str(Path(disk_cache))
    with _default_lock:
        cache = _default_caches.get(setting)
        if cache is None:
            cache = _default_caches[setting] = CompileCache(
                disk_cache=disk_cache, disk_limit_bytes=default_disk_limit_bytes()
            )
        return cache


def compile_grammar(
    grammar: Grammar,
    vocabulary: Vocabulary,
    *,
    disk_cache: bool | str | os.PathLike[str] = False,
    budget: CompileBudget | None = None,
    cache: CompileCache | None = None,
) -> CompiledGrammar:
    """Compile ``grammar`` for ``vocabulary``: its automaton; masks come lazily.

    Args:
        disk_cache: ``False`` (default) for none, ``True`` for the default directory, a path
            for another (ignored when ``cache`` is given: the cache has its own setting).
            Off by default: an entry holds the automaton's build inputs, which
            the cache key's fingerprint has already flattened, so a load costs more than the
            build (60 MaskBench schemas, Llama-3: median 1.41-1.60 ms a compile with the
            store, 0.56-0.67 without; a diagnostic timing loop).
        budget: time and state limits of this compile (default :class:`CompileBudget()`:
            10 s, 500k NFA states per rule, 200k DFA states in all, made as decoding
            reaches them).
        cache: the :class:`CompileCache` to use (default: the process-wide one).

    Raises:
        GrammarError: the grammar is invalid (left recursion, matches nothing, ...).
        CompileLimitError: past a limit of ``budget`` (``AutomatonLimitError`` for a state
            limit), raised within about the budget's time; past the DFA state limit, the
            mask or step that would make one more raises it later.
        TypeError: ``grammar`` is not a :class:`Grammar` or ``vocabulary`` not a
            :class:`Vocabulary`.
    Costs the start rule's NFA (or every rule's, where the others cannot wait for a state
    that calls them) and the first mask (DFA states are made as walks reach them: about
    0.3 ms natively for a median MaskBench schema); a cached grammar costs a dictionary
    lookup, or one file read from the disk store.
    """
    if not isinstance(grammar, Grammar):
        raise TypeError(f"compile_grammar needs a Grammar, not {type(grammar).__name__}")
    check_vocabulary(vocabulary)
    chosen = cache if cache is not None else default_cache(disk_cache)
    return chosen.compile(grammar, vocabulary, budget)


def check_first_mask(compiled: CompiledGrammar) -> None:
    """Raise ``GrammarError`` when no token of the vocabulary can begin an output (a
    vocabulary without a ``"`` token under a string schema): the matcher could never take
    a step, nor end. Costs the first mask's walk, which the first step needs anyway."""
    stacks, can_end = compiled.automaton.initial()
    if not compiled.mask_words(stacks, can_end).any():
        raise GrammarError(
            "no token of this vocabulary can begin the grammar's output (its first mask "
            "is empty): decoding could never start"
        )


def check_vocabulary(vocabulary: object) -> None:
    """Raise ``TypeError`` unless ``vocabulary`` is a :class:`Vocabulary` (a ``None`` used to
    fail later as "'NoneType' object has no attribute 'fingerprint'")."""
    if not isinstance(vocabulary, Vocabulary):
        raise TypeError(
            f"expected a formline Vocabulary (Vocabulary.from_gguf, from_huggingface, ...), "
            f"not {type(vocabulary).__name__}"
        )


def clear_memory_cache() -> None:
    """Forget in-process compiled grammars and token tries (the disk store stays)."""
    with _default_lock:
        caches = list(_default_caches.values())
    for cache in caches:
        cache.clear(token_tables=True)
