"""The disk store against entries made to break it: each is refused and deleted, and the
grammar rebuilt from its own source, in bounded time and memory."""

from __future__ import annotations

import datetime
import io
import json
import os
import struct
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers_mask import synthetic_vocabulary

from formline.automata import AutomatonLimitError
from formline.grammar import Grammar
from formline.grammar.budget import CompileBudget, CompileLimitError
from formline.mask import GrammarMatcher, clear_memory_cache, compile_grammar
from formline.mask.compiler import CompileCache
from formline.schema import compile_schema
from formline.vocab import Vocabulary

VOCABULARY = synthetic_vocabulary()
LETTERS = Grammar.from_regex(r"[a-z]{1,5}")


def stored_arrays(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as stored:
        return {name: stored[name] for name in stored.files}


def write_arrays(path: Path, arrays: dict[str, Any]) -> None:
    with path.open("wb") as handle:
        np.savez(handle, **arrays)


def recompile(grammar: Grammar, directory: Path) -> Any:
    clear_memory_cache()
    return compile_grammar(grammar, VOCABULARY, disk_cache=directory)


def assert_rebuilt_and_right(directory: Path) -> None:
    compiled = recompile(LETTERS, directory)
    assert compiled.statistics.from_cache == "none"
    matcher = GrammarMatcher(compiled)
    assert matcher.accept_string("abc") and matcher.can_end()
    assert not GrammarMatcher(compiled).accept_string("7")


def test_an_entry_copied_under_another_key_is_refused(tmp_path: Path) -> None:
    # The header's key is what the file says of itself: [0-9]+'s entry under the key of
    # [a-z]{1,5}, its header edited, was used, and the grammar accepted "7", refused "a".
    digits = Grammar.from_regex(r"[0-9]+")
    compile_grammar(digits, VOCABULARY, disk_cache=tmp_path)
    (digits_path,) = tmp_path.glob("*.npz")
    clear_memory_cache()
    compile_grammar(LETTERS, VOCABULARY, disk_cache=tmp_path)
    (letters_path,) = set(tmp_path.glob("*.npz")) - {digits_path}
    arrays = stored_arrays(digits_path)
    header = json.loads(arrays["header"].tobytes())
    header["key"] = letters_path.stem
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    write_arrays(letters_path, arrays)
    assert_rebuilt_and_right(tmp_path)
    assert recompile(LETTERS, tmp_path).statistics.from_cache == "disk"  # written again


@pytest.mark.parametrize(
    "change",
    [
        {"seconds": "abc"},  # ValueError
        {"seconds": {}},  # TypeError
        {"limits": [2**70, 2**70, 2**70]},  # OverflowError
        {"limits": [500_000, 2**31 - 1, 10_000]},  # std::bad_alloc in the native build
        {"start": 10**400},
    ],
    ids=["text seconds", "object seconds", "huge limits", "huge DFA limit", "huge start"],
)
def test_a_header_with_wrong_values_is_refused(tmp_path: Path, change: dict[str, Any]) -> None:
    # Each raised out of the compile, and again in every later one (the file stayed).
    compile_grammar(LETTERS, VOCABULARY, disk_cache=tmp_path)
    (path,) = tmp_path.glob("*.npz")
    arrays = stored_arrays(path)
    header = {**json.loads(arrays["header"].tobytes()), **change}
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    write_arrays(path, arrays)
    assert_rebuilt_and_right(tmp_path)


def test_members_that_unpack_past_their_bound_are_refused(tmp_path: Path) -> None:
    # A member whose .npy header claims 2**45 elements (MemoryError), and an extra member
    # of zeros that unpacked to 3 GiB before the entry was used all the same.
    compile_grammar(LETTERS, VOCABULARY, disk_cache=tmp_path)
    (path,) = tmp_path.glob("*.npz")
    original = path.read_bytes()
    with zipfile.ZipFile(io.BytesIO(original)) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    claim = io.BytesIO()  # a valid .npy header over 8 bytes of data
    header = {"descr": "<i4", "fortran_order": False, "shape": (2**45,)}
    np.lib.format.write_array_header_1_0(claim, header)
    junk = io.BytesIO()
    np.save(junk, np.zeros(8))
    claimed = {**members, "a.npy": claim.getvalue() + bytes(8)}
    for replaced in (claimed, {**members, "junk.npy": junk.getvalue()}):
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, data in replaced.items():
                archive.writestr(name, data)
        path.write_bytes(buffer.getvalue())
        assert_rebuilt_and_right(tmp_path)
        path.write_bytes(original)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_a_pipe_named_as_an_entry_does_not_hang_the_compile(tmp_path: Path) -> None:
    compile_grammar(LETTERS, VOCABULARY, disk_cache=tmp_path)
    (path,) = tmp_path.glob("*.npz")
    path.unlink()
    os.mkfifo(path)  # its read waited for a writer for ever
    assert_rebuilt_and_right(tmp_path)
    assert path.is_file()  # the pipe was removed and the entry written again


def test_a_grammar_past_its_state_limit_is_compiled_again() -> None:
    # Its DFA states accumulate over every matcher of the cached grammar: once one walk met
    # the limit, every later compile got the failed automaton, and every matcher failed.
    words = [b""]
    for _ in range(11):
        words = [word + letter for word in words for letter in (b"a", b"b")] + words
    vocabulary = Vocabulary.from_list([b"<eos>", b"x", *sorted(set(words) - {b""})], eos_ids=[0])
    cache = CompileCache(disk_cache=False)
    grammar = Grammar.from_regex(r"x(a|b)*a(a|b){20}")
    budget = CompileBudget(dfa_states=2000)
    compiled = cache.compile(grammar, vocabulary, budget)
    matcher = GrammarMatcher(compiled)
    assert matcher.accept_string("x")
    with pytest.raises(AutomatonLimitError):
        matcher.next_token_mask_words()
    again = cache.compile(grammar, vocabulary, budget)
    assert again is not compiled
    assert GrammarMatcher(again).accept_string("xa")
    assert cache.compile(grammar, vocabulary, budget) is again


@pytest.mark.parametrize("value", [np.int64(5), struct], ids=["numpy integer", "module"])
def test_a_schema_value_that_is_not_json_is_refused(value: Any) -> None:
    # With default=str in the cache key, {"const": np.int64(5)} got {"const": "5"}'s grammar.
    compile_schema({"const": "5"}, VOCABULARY, disk_cache=False)
    with pytest.raises(TypeError, match="not JSON"):
        compile_schema({"const": value}, VOCABULARY, disk_cache=False)


def test_an_annotation_that_is_not_json_still_compiles() -> None:
    schema = {"type": "string", "maxLength": 3, "default": datetime.date(2020, 1, 1)}
    assert compile_schema(schema, VOCABULARY, disk_cache=False).matcher().accept_string('"ab"')


def test_a_caller_waiting_for_the_same_compile_keeps_its_own_budget() -> None:
    # The second caller waited for the first caller's compile without a limit: 5 s under a
    # 0.5 s budget. It now ends at its own deadline; the first compile is unharmed.
    properties = {f"p{k}": {"type": "integer"} for k in range(600)}
    schema = {"type": "object", "properties": properties, "maxProperties": 300}
    cache = CompileCache(disk_cache=False)
    first: list[Any] = []
    thread = threading.Thread(
        target=lambda: first.append(
            compile_schema(schema, VOCABULARY, cache=cache, budget=CompileBudget(seconds=120))
        )
    )
    thread.start()
    started = time.monotonic()  # until the first compile is building the schema's grammar
    while not any(key[0] == "schema-grammar" for key in list(cache._building)):
        assert time.monotonic() - started < 60, "the first compile never started"  # hang guard
        time.sleep(0.001)
    with pytest.raises(CompileLimitError, match="waiting for the same compile"):
        compile_schema(schema, VOCABULARY, cache=cache, budget=CompileBudget(seconds=0.05))
    thread.join(timeout=300)
    assert first and first[0].matcher().accept_string('{"p0":1}')


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="symbolic links")
def test_a_link_planted_under_the_writers_name_is_not_followed(tmp_path: Path) -> None:
    # The temporary file's name was the key, the pid and the thread: a link planted there
    # by anyone who may write to the folder was followed, and the entry overwrote its target.
    cache_folder = tmp_path / "cache"
    compile_grammar(LETTERS, VOCABULARY, disk_cache=cache_folder)
    (entry,) = cache_folder.glob("*.npz")
    entry.unlink()
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"the user's own file")
    planted = cache_folder / f"{entry.stem}.{os.getpid()}.{threading.get_ident()}.tmp"
    os.symlink(victim, planted)
    assert_rebuilt_and_right(cache_folder)
    assert victim.read_bytes() == b"the user's own file"
    assert entry.is_file() and not entry.is_symlink()


def test_the_eviction_leaves_files_the_cache_did_not_write(tmp_path: Path) -> None:
    # A disk_cache folder shared with the user's files lost every *.pickle, *.npz and *.tmp.
    foreign = {
        "model.pickle": b"user data",
        "embeddings.npz": b"PK arrays",
        "draft.tmp": b"notes",
        f"{'0' * 63}.npz": b"a key one digit short",
    }
    for name, data in foreign.items():
        (tmp_path / name).write_bytes(data)
        os.utime(tmp_path / name, (1_000_000, 1_000_000))  # older than any entry, stale
    stale_writer = tmp_path / f"{'a' * 64}.123.456.tmp"
    stale_writer.write_bytes(b"a crashed writer's part")
    os.utime(stale_writer, (1_000_000, 1_000_000))
    cache = CompileCache(disk_cache=tmp_path, disk_limit_bytes=1)
    cache.compile(LETTERS, VOCABULARY)
    assert {name: (tmp_path / name).read_bytes() for name in foreign} == foreign
    assert not stale_writer.exists()
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(foreign)  # its entry
    # went too, past the limit


def test_an_entry_is_as_readable_as_a_file_the_process_writes(tmp_path: Path) -> None:
    # mkstemp's 0600 stayed on the entry: a folder shared between users could not be read.
    compile_grammar(LETTERS, VOCABULARY, disk_cache=tmp_path)
    (entry,) = tmp_path.glob("*.npz")
    plain = tmp_path / "plain"
    plain.write_bytes(b"")
    assert entry.stat().st_mode & 0o777 == plain.stat().st_mode & 0o777
