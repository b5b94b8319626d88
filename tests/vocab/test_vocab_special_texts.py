"""llama.cpp's text rules for control and stop tokens (``vocab/special_texts.py``): unit
cases of each rule, and the real thing: for every fixture vocabulary, formline's stop ids
equal llama.cpp's end-of-generation ids, and every token llama.cpp treats as control is
special to formline (never allowed as text)."""

from __future__ import annotations

import pytest

from formline.vocab import Vocabulary
from formline.vocab.fixtures import fixture_path
from formline.vocab.special_texts import read_text_rules

llama_cpp = pytest.importorskip("llama_cpp")

FIXTURES = ["smollm2", "phi-3", "qwen2", "llama-bpe", "llama-spm", "gpt-2"]


def test_end_and_fill_in_the_middle_texts_are_special() -> None:
    texts = [b"a", b"</s>", b"<|fim_prefix|>", b"<|file_sep|>", b"<|im_end|>x"]
    rules = read_text_rules(texts, {0})
    assert rules.special == {1, 2, 3}  # a near miss ("<|im_end|>x") stays text
    assert rules.stopping == {0, 1, 3}  # the file's own eos, the end and file-separator
    assert rules.ordinary == set()


def test_the_workarounds_make_a_marker_ordinary_again() -> None:
    harmony = [b"<|end|>", b"<|return|>", b"<|call|>"]
    rules = read_text_rules(harmony, set())
    assert rules.ordinary == {0} and rules.stopping == {1, 2} and rules.special == {1, 2}
    gemma = [b"</s>", b"<|tool_response>"]
    assert read_text_rules(gemma, {0}).ordinary == {0}  # even as the file's eos
    assert read_text_rules([b"</s>"], set()).stopping == {0}


def test_the_rules_follow_llama_cpps_finer_points() -> None:
    # "<|calls|>" is a call marker with "<|return|>" too.
    assert read_text_rules([b"x", b"<|return|>", b"<|calls|>", b"<|end|>"], set()).ordinary == {3}
    # A FIM kind the file names by id is not looked for by text.
    texts = [b"<|fim_pad|>", b"<|file_sep|>", b"a"]
    assert read_text_rules(texts, {2}, frozenset({"pad"})).stopping == {1, 2}
    assert read_text_rules(texts, set()).stopping == {0, 1}
    # A text held by two ids counts for the last (llama.cpp's text-to-id map keeps it).
    assert read_text_rules([b"</s>", b"a", b"</s>"], set()).stopping == {2}


@pytest.mark.parametrize("name", FIXTURES)
def test_stop_and_control_tokens_agree_with_llama_cpp(name: str) -> None:
    # phi-3's </s> (id 2) and Qwen2's (128247) were text to the mask: llama.cpp stops on them.
    path = fixture_path(name)
    parameters = llama_cpp.llama_model_default_params()
    parameters.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), parameters)
    assert model, f"llama.cpp could not load {path}"
    try:
        vocab = llama_cpp.llama_model_get_vocab(model)
        size = llama_cpp.llama_vocab_n_tokens(vocab)
        stopping = {i for i in range(size) if llama_cpp.llama_vocab_is_eog(vocab, i)}
        control = {i for i in range(size) if llama_cpp.llama_vocab_is_control(vocab, i)}
    finally:
        llama_cpp.llama_model_free(model)
    vocabulary = Vocabulary.from_gguf(path)
    assert set(vocabulary.eos_ids) == stopping
    assert control <= set(vocabulary.special_ids)
