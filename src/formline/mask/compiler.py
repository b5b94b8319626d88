"""``compile_grammar``: bind a grammar to a vocabulary once, cached in memory and on disk.

The cache key is the hash of the grammar's rules, the vocabulary's fingerprint, the limits
and formline's cache format version, so a second compile of the same grammar for the same
vocabulary is a dictionary lookup (in-process) or one pickle load (a new process). The
per-vocabulary token index is cached the same way, in memory.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import threading
import time
from collections import OrderedDict
from pathlib import Path

from formline.automata.dfa import DEFAULT_DFA_STATE_LIMIT
from formline.automata.nfa import DEFAULT_NFA_STATE_LIMIT
from formline.grammar.ir import Grammar
from formline.mask.compiled import CompiledGrammar, CompileStatistics, build_compiled
from formline.mask.token_index import TokenIndex
from formline.parser.pushdown import DEFAULT_STACK_LIMIT, build_pushdown
from formline.vocab import Vocabulary

CACHE_FORMAT_VERSION = "1"
MEMORY_CACHE_ENTRIES = 64

_memory_cache: OrderedDict[str, CompiledGrammar] = OrderedDict()
_index_cache: dict[str, TokenIndex] = {}
_lock = threading.Lock()


def default_cache_directory() -> Path:
    """``$FORMLINE_CACHE_DIR`` or ``~/.cache/formline``."""
    configured = os.environ.get("FORMLINE_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "formline"


def token_index_for(vocabulary: Vocabulary) -> TokenIndex:
    """The (cached) token index of a vocabulary. First call costs O(total token bytes)."""
    fingerprint = vocabulary.fingerprint()
    with _lock:
        index = _index_cache.get(fingerprint)
    if index is None:
        index = TokenIndex(vocabulary)
        with _lock:
            _index_cache[fingerprint] = index
    return index


def compile_grammar(
    grammar: Grammar,
    vocabulary: Vocabulary,
    *,
    disk_cache: bool | str | os.PathLike[str] = True,
    nfa_state_limit: int = DEFAULT_NFA_STATE_LIMIT,
    dfa_state_limit: int = DEFAULT_DFA_STATE_LIMIT,
    stack_limit: int = DEFAULT_STACK_LIMIT,
) -> CompiledGrammar:
    """Compile ``grammar`` for ``vocabulary``: automata plus every state's token mask.

    Args:
        disk_cache: ``True`` for the default directory, a path for another, ``False`` for none.

    Raises:
        GrammarError: the grammar is invalid (left recursion, matches nothing, ...).
        AutomatonLimitError: an automaton exceeds its state limit (raised in bounded time).
    Costs milliseconds for small grammars (measured in ``bench/``); a cached grammar costs a
    dictionary lookup, or one file read from the disk cache.
    """
    key = _cache_key(grammar, vocabulary, (nfa_state_limit, dfa_state_limit, stack_limit))
    with _lock:
        cached = _memory_cache.get(key)
        if cached is not None:
            _memory_cache.move_to_end(key)
            return cached
    started = time.perf_counter()
    directory = _cache_directory(disk_cache)
    compiled = _load(directory, key, vocabulary) if directory else None
    if compiled is not None:
        compiled.statistics.from_cache = "disk"
        compiled.statistics.seconds = time.perf_counter() - started
    else:
        automaton = build_pushdown(grammar, nfa_state_limit, dfa_state_limit, stack_limit)
        compiled = build_compiled(automaton, vocabulary, token_index_for(vocabulary), key)
        compiled.statistics.seconds = time.perf_counter() - started
        if directory:
            _store(directory, key, compiled)
    with _lock:
        _memory_cache[key] = compiled
        if len(_memory_cache) > MEMORY_CACHE_ENTRIES:
            _memory_cache.popitem(last=False)
    return compiled


def clear_memory_cache() -> None:
    """Forget in-process compiled grammars and token indexes (the disk cache stays)."""
    with _lock:
        _memory_cache.clear()
        _index_cache.clear()


def _cache_key(grammar: Grammar, vocabulary: Vocabulary, limits: tuple[int, ...]) -> str:
    digest = hashlib.sha256()
    for part in (
        CACHE_FORMAT_VERSION,
        grammar.fingerprint(),
        vocabulary.fingerprint(),
        repr(limits),
    ):
        digest.update(part.encode() + b"\x00")
    return digest.hexdigest()


def _cache_directory(disk_cache: bool | str | os.PathLike[str]) -> Path | None:
    if disk_cache is False:
        return None
    if disk_cache is True:
        return default_cache_directory() / "compiled"
    return Path(disk_cache)


def _load(directory: Path, key: str, vocabulary: Vocabulary) -> CompiledGrammar | None:
    path = directory / f"{key}.pickle"
    try:
        with path.open("rb") as handle:
            automaton, state_masks, statistics = pickle.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, AttributeError):
        return None  # a corrupt or foreign entry is recompiled and overwritten
    compiled = CompiledGrammar(automaton, vocabulary, state_masks, key)
    compiled.statistics = CompileStatistics(**statistics)
    return compiled


def _store(directory: Path, key: str, compiled: CompiledGrammar) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        temporary = directory / f"{key}.{os.getpid()}.tmp"
        statistics = dict(vars(compiled.statistics))
        payload = (compiled.automaton, compiled.state_masks, statistics)
        with temporary.open("wb") as handle:
            pickle.dump(payload, handle, protocol=pickle.HIGHEST_PROTOCOL)
        temporary.replace(directory / f"{key}.pickle")
    except OSError:
        pass  # a read-only or full disk only costs the next process a recompile
