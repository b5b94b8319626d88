"""Import of llama.cpp's own GBNF grammars: every one compiles, and real text is accepted.

The grammars come from the llama-cpp-python sdist (``scripts/fetch_fixtures.py``); the texts
are tokenized canonically by SmolLM2's real tokenizer and walked token by token.
"""

from __future__ import annotations

import pytest

from formline.grammar import Grammar
from formline.mask import GrammarMatcher, compile_grammar
from formline.vocab.fixtures import fixture_path, gbnf_grammar_paths

SAMPLES = {
    "arithmetic.gbnf": ["(a+2)*b = c\n1 +x = y\n"],
    "json.gbnf": ['{"name": "Ada", "tags": ["a", {"b": null}], "n": -1.5e3}'],
    "json_arr.gbnf": ['[\n{"a": 1},\n{"b": [true, false]}]'],
    "list.gbnf": ["- milk\n- eggs, maybe\n"],
    "chess.gbnf": ["1. e4 e5\n2. Nf3 Nc6\n3. O-O Qxd8+\n"],
    "japanese.gbnf": ["こんにちは、世界。"],
    "english.gbnf": ["Hello, World! How are you today?"],
    "c.gbnf": ["int main(){int x = 1+2;return x;}"],
}


def test_every_llama_cpp_grammar_is_imported() -> None:
    names = {path.name for path in gbnf_grammar_paths()}
    assert {"json.gbnf", "arithmetic.gbnf", "c.gbnf", "chess.gbnf"} <= names
    assert names <= set(SAMPLES), f"a new grammar needs a sample text: {names - set(SAMPLES)}"


@pytest.fixture(scope="module")
def smollm2():
    from transformers import AutoTokenizer

    from formline.vocab import Vocabulary

    path = fixture_path("smollm2")
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return Vocabulary.from_gguf(path), tokenizer


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_llama_cpp_grammar_accepts_real_text(smollm2, name: str) -> None:
    vocabulary, tokenizer = smollm2
    paths = {path.name: path for path in gbnf_grammar_paths()}
    grammar = Grammar.from_gbnf(paths[name].read_text(encoding="utf-8"))
    compiled = compile_grammar(grammar, vocabulary, disk_cache=False)
    for text in SAMPLES[name]:
        matcher = GrammarMatcher(compiled)
        for token_id in tokenizer.encode(text, add_special_tokens=False):
            assert matcher.accept_token(token_id), (name, text, tokenizer.decode([token_id]))
        assert matcher.can_end(), (name, text)
