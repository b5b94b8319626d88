"""The matcher API: accept/refuse, EOS, rollback, jump-forward, bitmasks, caches, errors."""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import pytest
from helpers_mask import greedy_tokenize, synthetic_vocabulary

from formline.automata import AutomatonLimitError
from formline.grammar import Grammar
from formline.grammar.budget import CompileBudget
from formline.mask import (
    BatchGrammarMatcher,
    GrammarMatcher,
    TokenError,
    allocate_token_bitmask,
    apply_token_bitmask_inplace,
    bitmask_to_ids,
    clear_memory_cache,
    compile_grammar,
)
from formline.mask import bitmask as bitmask_module
from formline.mask.bitmask import apply_token_bitmask_reference
from formline.mask.reference import brute_force_allowed_ids
from formline.schema import compile_schema
from formline.vocab import Vocabulary

VOCABULARY = synthetic_vocabulary()
TOKEN = {token: token_id for token_id, token in enumerate(VOCABULARY.token_bytes) if token}


def matcher_for(grammar: Grammar) -> GrammarMatcher:
    return GrammarMatcher(compile_grammar(grammar, VOCABULARY, disk_cache=False))


def test_refused_token_leaves_state_unchanged_and_eos_only_at_accept() -> None:
    matcher = matcher_for(Grammar.from_regex(r"ab+c"))
    assert not matcher.accept_token(TOKEN[b"c"])
    assert not matcher.accept_token(0)  # EOS before the end
    assert matcher.accept_token(TOKEN[b"ab"])
    before = matcher.allowed_token_ids().tolist()
    assert not matcher.accept_token(TOKEN[b"ba"])
    assert matcher.allowed_token_ids().tolist() == before
    assert 0 not in before
    assert matcher.accept_token(TOKEN[b"bb"]) and matcher.accept_token(TOKEN[b"c"])
    assert matcher.can_end() and matcher.allowed_token_ids().tolist() == [0]
    assert matcher.accept_token(0) and matcher.is_terminated()
    assert not matcher.accept_token(TOKEN[b"c"])


def test_special_tokens_are_never_allowed_inside_the_grammar() -> None:
    matcher = matcher_for(Grammar.from_regex(r".*"))
    allowed = set(matcher.allowed_token_ids().tolist())
    assert 1 not in allowed and not matcher.accept_token(1)
    assert 0 in allowed  # the empty string is complete: EOS allowed
    padding = range(len(VOCABULARY.token_bytes) - 5, VOCABULARY.size)
    assert not allowed.intersection(padding)


def test_unknown_token_id_is_a_clear_error() -> None:
    matcher = matcher_for(Grammar.from_regex("a"))
    with pytest.raises(TokenError, match=f"token id {VOCABULARY.size} is outside"):
        matcher.accept_token(VOCABULARY.size)
    with pytest.raises(TokenError):
        matcher.accept_token(-1)


def test_accept_token_takes_numpy_ids_and_keeps_a_bounded_history() -> None:
    matcher = GrammarMatcher(
        compile_grammar(Grammar.from_regex(r"(ab)+"), VOCABULARY, disk_cache=False),
        max_rollback_tokens=2,
    )
    with pytest.raises(TokenError, match="outside the vocabulary"):
        matcher.accept_token(2**70)  # past a C integer: still the named error
    with pytest.raises(TokenError):
        matcher.accept_token(np.int64(VOCABULARY.size))
    start = matcher.state_key()
    for _ in range(3):
        assert matcher.accept_token(np.int64(TOKEN[b"ab"]))
    assert not matcher.accept_token(np.int32(TOKEN[b"ba"]))
    with pytest.raises(ValueError, match="cannot roll back 3 tokens: 2 can be undone"):
        matcher.rollback(3)
    matcher.rollback(2)
    assert matcher.state_key() != start and matcher.can_end()
    matcher.reset()
    assert matcher.state_key() == start and not matcher.can_end()


def test_rollback_restores_masks_and_termination() -> None:
    matcher = matcher_for(Grammar.from_ebnf('root ::= "(" root ")" | "x"'))
    masks = [matcher.allowed_token_ids().tolist()]
    for token in [b"((", b"x", b")", b")"]:
        assert matcher.accept_token(TOKEN[token])
        masks.append(matcher.allowed_token_ids().tolist())
    assert matcher.accept_token(0)
    matcher.rollback(1)
    assert not matcher.is_terminated() and matcher.allowed_token_ids().tolist() == masks[-1]
    matcher.rollback(3)
    assert matcher.allowed_token_ids().tolist() == masks[1]
    with pytest.raises(ValueError, match="cannot roll back 5"):
        matcher.rollback(5)


def test_state_key_is_hashable_and_tracks_the_parse_state() -> None:
    matcher = matcher_for(Grammar.from_regex(r"(ab)+"))
    start = matcher.state_key()
    assert matcher.accept_token(TOKEN[b"ab"])
    after_one = matcher.state_key()
    assert after_one != start and hash(after_one) is not None
    assert matcher.accept_token(TOKEN[b"ab"])
    assert matcher.state_key() == after_one  # the same DFA state: one cached mask
    matcher.rollback(2)
    assert matcher.state_key() == start


def test_jump_forward_string_is_forced_text_and_does_not_move() -> None:
    matcher = matcher_for(Grammar.from_regex(r'\{"name":"[a-z]+","age":[0-9]+\}'))
    assert matcher.find_jump_forward_string() == '{"name":"'
    for token_id in greedy_tokenize(VOCABULARY, b'{"name":"ab'):
        assert matcher.accept_token(token_id)
    assert matcher.find_jump_forward_string() == ""
    assert matcher.accept_token(TOKEN[b'",'])
    assert matcher.find_jump_forward_string() == '"age":'
    choice = matcher_for(Grammar.from_choices(["中文abc", "中文abd"]))
    assert choice.find_jump_forward_string() == "中文ab"


def test_bitmask_fill_and_apply_numpy() -> None:
    matcher = matcher_for(Grammar.from_regex(r"[ab]"))
    bitmask = allocate_token_bitmask(2, VOCABULARY.size)
    assert bitmask.shape == (2, (VOCABULARY.size + 31) // 32) and bitmask.dtype == np.int32
    assert matcher.fill_next_token_bitmask(bitmask, index=1)
    expected = sorted({TOKEN[b"a"], TOKEN[b"b"]})
    assert bitmask_to_ids(bitmask[1], VOCABULARY.size).tolist() == expected
    assert (bitmask[0] == -1).all()
    logits = np.zeros((2, VOCABULARY.size), dtype=np.float32)
    apply_token_bitmask_inplace(logits, bitmask)
    assert np.isfinite(logits[1]).nonzero()[0].tolist() == expected
    assert np.isfinite(logits[0]).all()
    wider = np.zeros(VOCABULARY.size + 40, dtype=np.float32)  # logits larger than the vocabulary
    apply_token_bitmask_inplace(wider, bitmask[1])
    assert np.isfinite(wider).nonzero()[0].tolist() == expected


def test_bitmask_apply_torch() -> None:
    torch = pytest.importorskip("torch", reason="needs torch: pip install torch==2.13.0")
    matcher = matcher_for(Grammar.from_regex(r"[ab]"))
    bitmask = torch.from_numpy(allocate_token_bitmask(1, VOCABULARY.size))
    matcher.fill_next_token_bitmask(bitmask)
    logits = torch.zeros(1, VOCABULARY.size)
    apply_token_bitmask_inplace(logits, bitmask)
    allowed = torch.isfinite(logits[0]).nonzero().flatten().tolist()
    assert allowed == sorted({TOKEN[b"a"], TOKEN[b"b"]})


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("path", ["native", "torch"])
def test_bitmask_apply_torch_rows_equal_numpy(seed: int, path: str, monkeypatch: Any) -> None:
    """Both ways torch logits are masked equal the bit-by-bit reference, row by row: selected
    rows only, logits wider than the bitmask, a 1-D bfloat16 row. Contiguous CPU logits take
    the native kernel; strided ones (or a GPU's) the vectorised torch kernel of a vLLM batch,
    checked here on a strided view, with the native kernel made to fail if it is called."""
    torch = pytest.importorskip("torch", reason="needs torch: pip install torch==2.13.0")
    if path == "torch":
        monkeypatch.setattr(bitmask_module, "_apply_native", _must_not_be_called)
    rng = np.random.default_rng(seed)
    batch, vocab = 5, 100 + seed * 7
    bitmask = rng.integers(-(2**31), 2**31, size=(batch, (vocab + 31) // 32), dtype=np.int64)
    bitmask = bitmask.astype(np.int32)
    indices = sorted(rng.choice(batch, size=int(rng.integers(1, batch + 1)), replace=False))
    width = vocab + 9  # logits past the bitmask's coverage are disallowed
    expected = rng.normal(size=(batch, width)).astype(np.float32)
    actual = _torch_logits(torch, expected, path, torch.float32)
    apply_token_bitmask_reference(expected, bitmask, None, [int(i) for i in indices])
    apply_token_bitmask_inplace(actual, bitmask, indices=[int(i) for i in indices])
    assert np.array_equal(actual.numpy(), expected)
    reference = np.zeros((1, width), dtype=np.float32)
    one_row = _torch_logits(torch, reference, path, torch.bfloat16)[0]  # vLLM's CPU logits
    apply_token_bitmask_inplace(one_row, bitmask[0])  # may be bf16
    apply_token_bitmask_reference(reference, bitmask[:1], None, None)
    assert np.array_equal(one_row.float().numpy(), reference[0])


def _torch_logits(torch: Any, values: np.ndarray, path: str, dtype: Any) -> Any:
    """A copy of ``values`` as torch logits of ``dtype``: contiguous, or for the torch path a
    strided view (every other column of a tensor twice as wide)."""
    if path == "native":
        return torch.from_numpy(values.copy()).to(dtype)
    return torch.from_numpy(np.repeat(values, 2, axis=1)).to(dtype)[:, ::2]


def _must_not_be_called(*arguments: Any) -> None:
    raise AssertionError("the native kernel ran where the torch kernel should")


def test_compile_is_cached_in_memory_and_on_disk(tmp_path) -> None:
    grammar = Grammar.from_regex(r"[a-z]{3}[0-9]+")
    first = compile_grammar(grammar, VOCABULARY, disk_cache=tmp_path)
    assert first.statistics.from_cache == "none"
    assert compile_grammar(grammar, VOCABULARY, disk_cache=tmp_path) is first
    assert len(list(tmp_path.glob("*.npz"))) == 1
    assert not list(tmp_path.glob("*.pickle"))  # nothing that runs code when loaded
    clear_memory_cache()
    second = compile_grammar(grammar, VOCABULARY, disk_cache=tmp_path)
    assert second.statistics.from_cache == "disk" and second is not first
    np.testing.assert_array_equal(second.automaton.transitions, first.automaton.transitions)
    for compiled in (first, second):
        matcher = GrammarMatcher(compiled)
        assert matcher.accept_string("abc")
        np.testing.assert_array_equal(matcher.allowed_token_ids(), brute_force_allowed_ids(matcher))
    (next(tmp_path.glob("*.npz"))).write_bytes(b"corrupt")
    clear_memory_cache()
    third = compile_grammar(grammar, VOCABULARY, disk_cache=tmp_path)
    assert third.statistics.from_cache == "none"  # a corrupt entry is rebuilt, not fatal


def test_a_foreign_or_tampered_disk_entry_is_rebuilt(tmp_path) -> None:
    grammar = Grammar.from_regex(r"(ab|ba)+")
    compile_grammar(grammar, VOCABULARY, disk_cache=tmp_path)
    path = next(tmp_path.glob("*.npz"))
    with np.load(path) as stored:
        arrays = {name: stored[name] for name in stored.files}
    header = json.loads(arrays["header"].tobytes())
    # Indices the kernel would follow, out of range; a node kind that does not exist; a
    # child after its parent; an array of another type; an older format.
    tampered = [
        dict(arrays, a=np.full_like(arrays["a"], 10**6)),
        dict(arrays, kind=np.full_like(arrays["kind"], 9)),
        dict(arrays, children=np.full_like(arrays["children"], len(arrays["kind"]))),
        dict(arrays, rule_root=np.full_like(arrays["rule_root"], -1)),
        dict(arrays, a=arrays["a"].astype(np.int64)),
        dict(arrays, header=np.frombuffer(json.dumps({**header, "version": 2}).encode(), np.uint8)),
    ]
    for replacement in tampered:
        with path.open("wb") as handle:
            np.savez(handle, **replacement)
        clear_memory_cache()
        rebuilt = compile_grammar(grammar, VOCABULARY, disk_cache=tmp_path)
        assert rebuilt.statistics.from_cache == "none"
        matcher = GrammarMatcher(rebuilt)
        assert matcher.accept_string("abba") and matcher.can_end()


def test_state_limit_is_an_error_in_bounded_time() -> None:
    # x(a|b)*a(a|b){20} needs 2^21 DFA states. The compile makes the few its first mask
    # reaches; after "x", a vocabulary of every a/b string up to 11 bytes walks into 2^12 of
    # them, past the limit of 2,000: that mask is an AutomatonLimitError, and so is the next.
    started = time.perf_counter()
    words = [b""]
    for _ in range(11):
        words = [word + letter for word in words for letter in (b"a", b"b")] + words
    tokens = sorted(set(words) - {b""})
    vocabulary = Vocabulary.from_list([b"<eos>", b"x", *tokens], eos_ids=[0])
    compiled = compile_grammar(
        Grammar.from_regex(r"x(a|b)*a(a|b){20}"),
        vocabulary,
        disk_cache=False,
        budget=CompileBudget(dfa_states=2000),
    )
    assert compiled.automaton.size < 10
    matcher = GrammarMatcher(compiled)
    assert matcher.accept_string("x")
    for _ in range(2):
        with pytest.raises(AutomatonLimitError, match="more than 2000 DFA states"):
            matcher.next_token_mask_words()
    assert time.perf_counter() - started < 30  # generous: a hang would take forever


def test_mask_equals_brute_force_on_a_recursive_grammar() -> None:
    grammar = Grammar.from_ebnf(
        r'''root ::= value
        value ::= "{" ( pair ( "," pair )* )? "}" | "[" ( value ( "," value )* )? "]"
                | str | /-?[0-9]+/ | "null"
        pair ::= str ":" value
        str ::= "\"" [a-z ]* "\""'''
    )
    matcher = matcher_for(grammar)
    text = b'{"ab":[1,[],{"c":null}],"x":"the"}'
    for token_id in greedy_tokenize(VOCABULARY, text):
        np.testing.assert_array_equal(matcher.allowed_token_ids(), brute_force_allowed_ids(matcher))
        assert matcher.accept_token(token_id)
    assert matcher.can_end()


def test_a_token_id_given_as_a_tensor_or_numpy_int_is_read_as_its_int() -> None:
    # A 0-d tensor passed the range check but hashed by identity: the stop token was
    # refused at the end (the README's sampling loop), and each call cached a new step.
    torch = pytest.importorskip("torch")
    matcher = matcher_for(Grammar.from_regex(r"ab"))
    steps = matcher.compiled.kernel.steps
    assert matcher.accept_token(torch.tensor(TOKEN[b"a"]))
    assert matcher.accept_token(np.int64(TOKEN[b"b"]))
    assert matcher.accept_token(torch.tensor(0)) and matcher.is_terminated()
    cached = len(steps)
    for _ in range(5):
        again = matcher_for(Grammar.from_regex(r"ab"))
        assert again.accept_token(torch.tensor(TOKEN[b"a"]))
    assert len(steps) == cached  # one entry per (configuration, token), not per call


def test_xgrammars_minus_one_keeps_every_step_for_rollback() -> None:
    compiled = compile_grammar(Grammar.from_regex(r"abc"), VOCABULARY, disk_cache=False)
    matcher = GrammarMatcher(compiled, max_rollback_tokens=-1)  # XGrammar's "unlimited"
    assert matcher.accept_token(TOKEN[b"a"]) and matcher.accept_token(TOKEN[b"b"])
    matcher.rollback(2)  # the history was emptied at every step
    assert matcher.accept_token(TOKEN[b"a"])
    with pytest.raises(TypeError):
        GrammarMatcher(compiled, max_rollback_tokens=2.5)  # type: ignore[arg-type]


def test_accept_tokens_reads_an_iterator_and_refuses_non_integers_first() -> None:
    matcher = matcher_for(Grammar.from_regex(r"ab"))
    # The check used the iterator up: nothing was walked and the answer was True.
    assert not matcher.accept_tokens(iter([TOKEN[b"b"]]))
    assert matcher.accept_tokens(token for token in [TOKEN[b"a"], TOKEN[b"b"]])
    other = matcher_for(Grammar.from_regex(r"ab"))
    with pytest.raises(TypeError):
        other.accept_tokens([TOKEN[b"a"], float(TOKEN[b"b"])])
    assert other.accept_token(TOKEN[b"a"])  # nothing was taken before the error


def test_a_compiled_schema_is_taken_and_a_wrong_object_named() -> None:
    schema = compile_schema({"type": "boolean"}, VOCABULARY, disk_cache=False)
    assert GrammarMatcher(schema).accept_string("true")  # XGrammar's idiom
    with pytest.raises(TypeError, match="not str"):
        GrammarMatcher("true")  # type: ignore[arg-type]


def test_a_state_of_another_grammar_is_an_error_not_a_crash() -> None:
    small = compile_grammar(Grammar.from_regex(r"a"), VOCABULARY, disk_cache=False)
    with pytest.raises(ValueError, match="outside this grammar's"):
        small.mask_words(frozenset({(999_999,)}), False)  # was a segmentation fault
    with pytest.raises(ValueError, match="outside this grammar's"):
        small.advance_bytes(frozenset({(0, 41)}), b"a")
    with pytest.raises(ValueError, match="empty stack"):
        small.mask_words(frozenset({()}), False)


def test_the_batch_reads_token_ids_as_accept_token_does() -> None:
    batch = BatchGrammarMatcher(max_threads=1)
    matcher = matcher_for(Grammar.from_regex(r"ab"))
    for wrong in (float(TOKEN[b"a"]) + 0.9, str(TOKEN[b"a"])):  # int() took them as "a"
        with pytest.raises(TypeError):
            batch.batch_accept_token([matcher], [wrong])
    assert batch.batch_accept_token([matcher], [np.int32(TOKEN[b"a"])]) == [True]
