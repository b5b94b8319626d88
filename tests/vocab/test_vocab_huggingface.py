"""Differential checks against transformers, and the duck-typed HF adapter.

The GGUF fixtures are also loaded by transformers (``AutoTokenizer`` with
``gguf_file=``), which gives an independent implementation to compare with: our
token bytes must be exactly what the transformers tokenizer decodes in context.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

import pytest

import formline
from formline.vocab import Vocabulary, VocabularyError
from formline.vocab.fixtures import fixture_path

ROUND_TRIP_TEXTS = [
    "hello world",
    "Café naïve façade, Ünïcödé ẞ ÿ Ω ≤ ∑ ½",
    "日本語のテキスト、中文字符，한국어",
    "emoji 🎉🚀 family 👩‍👩‍👧 flag 🇫🇷",
    '{"key": [1, 2.5e-3, true, null], "nested": {"s": "a\\"b\\\\n"}}',
    "  leading spaces\n\ttab\r\nwindows line\n\n\n",
    "Привет, мир! مرحبا नमस्ते ¿Qué?",
    "<|im_start|> is just text here",
    "\x01\x07 control \x7f bytes",
]


def decode(tokenizer: Any, ids: list[int]) -> str:
    return str(tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False))


def assert_decodes_like_transformers(
    vocabulary: Vocabulary, tokenizer: Any, prefix_piece: str
) -> None:
    """Every id's bytes equal what transformers decodes for it after a plain prefix token.

    Decoding ``[prefix, id]`` puts the token mid-sequence, so SentencePiece's strip of
    the first token's leading space does not apply. ``decode`` returns ``str``: a
    token that is not valid UTF-8 on its own (a partial character, a byte-fallback
    byte) shows as U+FFFD on both sides, which is compared here; the exact bytes of
    those tokens are pinned by the byte-completion and round-trip tests.
    """
    prefix_id = tokenizer.convert_tokens_to_ids(prefix_piece)
    prefix = decode(tokenizer, [prefix_id]).encode()
    pieces = tokenizer.convert_ids_to_tokens(list(range(vocabulary.size)))
    mismatches = []
    for token_id, ours in enumerate(vocabulary.token_bytes):
        if ours == b"":  # padding: the tokenizer has a "[PAD<id>]" filler there
            assert pieces[token_id] == f"[PAD{token_id}]", token_id
            assert token_id in vocabulary.special_ids
            continue
        expected = (prefix + ours).decode("utf-8", errors="replace")
        if decode(tokenizer, [prefix_id, token_id]) != expected:
            mismatches.append((token_id, pieces[token_id], ours))
    assert mismatches == []


def utf8_completion(lead: int) -> bytes | None:
    """A valid UTF-8 character containing byte ``lead`` (None for never-valid bytes)."""
    if lead < 0x80:
        return bytes((lead,))
    if lead <= 0xBF:
        return bytes((0xC2, lead))
    if 0xC2 <= lead <= 0xDF:
        return bytes((lead, 0x80))
    if 0xE0 <= lead <= 0xEF:
        return bytes((lead, 0xA0 if lead == 0xE0 else 0x80, 0x80))
    if 0xF0 <= lead <= 0xF4:
        return bytes((lead, 0x90 if lead == 0xF0 else 0x80, 0x80, 0x80))
    return None


class TestSmolLM2Differential:
    def test_every_id_decodes_like_transformers(
        self, smollm2_vocab: Vocabulary, smollm2_tokenizer: Any
    ) -> None:
        assert len(smollm2_tokenizer) == smollm2_vocab.size
        assert_decodes_like_transformers(smollm2_vocab, smollm2_tokenizer, "a")

    @pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
    def test_round_trip(self, smollm2_vocab: Vocabulary, smollm2_tokenizer: Any, text: str) -> None:
        ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
        assert b"".join(smollm2_vocab.token_bytes[i] for i in ids) == text.encode()

    def test_from_huggingface_equals_from_gguf(
        self, smollm2_vocab: Vocabulary, smollm2_tokenizer: Any
    ) -> None:
        from_hf = Vocabulary.from_huggingface(smollm2_tokenizer)
        assert from_hf.token_bytes == smollm2_vocab.token_bytes
        assert from_hf.eos_ids == smollm2_vocab.eos_ids == frozenset({0, 2, 4})
        assert from_hf.special_ids == smollm2_vocab.special_ids
        assert from_hf.fingerprint() == smollm2_vocab.fingerprint()

    def test_from_huggingface_pads_to_vocab_size(self, smollm2_tokenizer: Any) -> None:
        padded = Vocabulary.from_huggingface(smollm2_tokenizer, vocab_size=49_160)
        assert padded.size == 49_160 and set(range(49_152, 49_160)) <= padded.special_ids
        with pytest.raises(VocabularyError, match=r"vocab_size 100 is smaller"):
            Vocabulary.from_huggingface(smollm2_tokenizer, vocab_size=100)


class TestPhi3Differential:
    def test_every_id_decodes_like_transformers(
        self, phi3_vocab: Vocabulary, phi3_tokenizer: Any
    ) -> None:
        assert len(phi3_tokenizer) == phi3_vocab.size
        # Prefix "a" is the plain piece, not the byte-fallback token <0x61>: the HF
        # ByteFallback decoder fuses adjacent byte tokens and would replace the whole
        # run (prefix included) by U+FFFD when the run is not valid UTF-8.
        assert_decodes_like_transformers(phi3_vocab, phi3_tokenizer, "a")

    def test_byte_fallback_tokens_complete_to_valid_characters(
        self, phi3_vocab: Vocabulary, phi3_tokenizer: Any
    ) -> None:
        # A lone byte token only decodes to U+FFFD; inside a valid UTF-8 sequence of
        # byte tokens transformers must decode exactly the character we expect.
        byte_token_ids = {
            phi3_vocab.token_bytes[i][0]: i
            for i in range(phi3_vocab.size)
            if phi3_tokenizer.convert_ids_to_tokens(i).startswith("<0x")
        }
        assert sorted(byte_token_ids) == list(range(256))
        prefix_id = phi3_tokenizer.convert_tokens_to_ids("a")  # keeps <0x20> mid-sequence
        checked = 0
        for value in range(256):
            character = utf8_completion(value)
            if character is None:
                continue
            ids = [prefix_id] + [byte_token_ids[byte] for byte in character]
            assert decode(phi3_tokenizer, ids) == "a" + character.decode(), hex(value)
            checked += 1
        assert checked == 256 - 13  # 0xC0, 0xC1, 0xF5..0xFF are never valid UTF-8

    @pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
    def test_round_trip(self, phi3_vocab: Vocabulary, phi3_tokenizer: Any, text: str) -> None:
        ids = phi3_tokenizer.encode(text, add_special_tokens=False)
        # SentencePiece's normalizer prepends "▁" (the "dummy prefix") to the input,
        # so the first piece carries a space that is not in the text; decoders strip
        # it again. Our bytes are mid-sequence bytes, so that space shows up here.
        assert phi3_tokenizer.convert_ids_to_tokens(ids[0]).startswith("▁")
        assert b"".join(phi3_vocab.token_bytes[i] for i in ids) == b" " + text.encode()

    def test_from_huggingface_equals_from_gguf(
        self, phi3_vocab: Vocabulary, phi3_tokenizer: Any
    ) -> None:
        from_hf = Vocabulary.from_huggingface(phi3_tokenizer)
        assert from_hf.token_bytes == phi3_vocab.token_bytes
        assert from_hf.eos_ids == phi3_vocab.eos_ids == frozenset({2, 32_000, 32_007})
        # </s> (id 2) is special=False in the HF tokenizer and USER_DEFINED in the GGUF
        # file, but llama.cpp stops on it by its text (and HF's decode drops it): special
        # and a stop on both sides.
        assert 2 in from_hf.special_ids
        assert from_hf.special_ids == phi3_vocab.special_ids
        assert from_hf.fingerprint() == phi3_vocab.fingerprint()


@pytest.mark.slow
class TestQwen2Differential:
    """Qwen2 (151,936 ids) through transformers: loading the tokenizer takes ~8 s."""

    @pytest.fixture(scope="class")
    def qwen2_tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        path = fixture_path("qwen2")
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)

    def test_every_id_decodes_like_transformers(
        self, qwen2_vocab: Vocabulary, qwen2_tokenizer: Any
    ) -> None:
        assert_decodes_like_transformers(qwen2_vocab, qwen2_tokenizer, "a")
        # The chat markers are added special tokens in transformers and CONTROL here.
        for text in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
            token_id = qwen2_tokenizer.convert_tokens_to_ids(text)
            assert qwen2_tokenizer.added_tokens_decoder[token_id].special
            assert token_id in qwen2_vocab.special_ids

    @pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
    def test_round_trip(self, qwen2_vocab: Vocabulary, qwen2_tokenizer: Any, text: str) -> None:
        ids = qwen2_tokenizer.encode(text, add_special_tokens=False)
        assert b"".join(qwen2_vocab.token_bytes[i] for i in ids) == text.encode()

    def test_from_huggingface_equals_from_gguf(
        self, qwen2_vocab: Vocabulary, qwen2_tokenizer: Any
    ) -> None:
        # transformers registers the "[PAD151646]".. fillers as non-special added
        # tokens; both constructors treat them as padding (b"", special).
        from_hf = Vocabulary.from_huggingface(qwen2_tokenizer)
        assert from_hf.fingerprint() == qwen2_vocab.fingerprint()


# --- duck-typed adapter, without transformers -------------------------------------


@dataclass
class FakeAddedToken:
    content: str
    special: bool


@dataclass
class FakeDecoder:
    description: str

    def __str__(self) -> str:
        return self.description


@dataclass
class FakeBackend:
    decoder: FakeDecoder


@dataclass
class FakeTokenizer:
    pieces: list[str]
    added_tokens_decoder: dict[int, FakeAddedToken] = field(default_factory=dict)
    eos_token_id: int | None = None
    all_special_ids: list[int] = field(default_factory=list)
    name_or_path: str = "org/fake-model"
    backend_tokenizer: FakeBackend | None = None

    def __len__(self) -> int:
        return len(self.pieces)

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str | None]:
        table = dict(enumerate(self.pieces))
        table.update({i: token.content for i, token in self.added_tokens_decoder.items()})
        return [table.get(i) for i in ids]


class TestDuckTypedAdapter:
    def test_byte_level_without_decoder(self) -> None:
        tokenizer = FakeTokenizer(
            pieces=["<|endoftext|>", "Ġhello", "Ċ", "Ã©", "<|im_end|>", "<tool>"],
            added_tokens_decoder={
                0: FakeAddedToken("<|endoftext|>", True),
                4: FakeAddedToken("<|im_end|>", True),
                5: FakeAddedToken("<tool>", False),
            },
            eos_token_id=0,
        )
        vocabulary = Vocabulary.from_huggingface(tokenizer)
        assert vocabulary.name == "fake-model"
        assert vocabulary.token_bytes == (
            b"<|endoftext|>",
            b" hello",
            b"\n",
            "é".encode(),
            b"<|im_end|>",
            b"<tool>",
        )
        assert vocabulary.eos_ids == frozenset({0, 4})  # declared eos + special <|im_end|>
        assert vocabulary.special_ids == frozenset({0, 4})

    def test_sentencepiece_with_holes_and_padding(self) -> None:
        tokenizer = FakeTokenizer(
            pieces=["<unk>", "<s>", "</s>", "<0x0A>", "▁hi", "[PAD5]"],
            added_tokens_decoder={
                0: FakeAddedToken("<unk>", True),
                2: FakeAddedToken("</s>", True),
                8: FakeAddedToken("<|end|>", True),
            },
            eos_token_id=2,
            all_special_ids=[0, 1, 2],
        )
        vocabulary = Vocabulary.from_huggingface(tokenizer, vocab_size=10)
        assert vocabulary.token_bytes[3:9] == (b"\n", b" hi", b"", b"", b"", b"<|end|>")
        assert vocabulary.eos_ids == frozenset({2, 8})
        assert vocabulary.special_ids == frozenset({0, 1, 2, 5, 6, 7, 8, 9})

    def test_decoder_decides_over_pieces(self) -> None:
        # "Ġ" pieces, but the decoder says SentencePiece with byte fallback.
        tokenizer = FakeTokenizer(
            pieces=["</s>", "Ġx", "<0x41>"],
            eos_token_id=0,
            backend_tokenizer=FakeBackend(FakeDecoder("Sequence(decoders=[ByteFallback()])")),
        )
        assert Vocabulary.from_huggingface(tokenizer).token_bytes == (b"</s>", "Ġx".encode(), b"A")

    def test_wordpiece_is_rejected(self) -> None:
        tokenizer = FakeTokenizer(pieces=["[SEP]", "hello", "##ing"], eos_token_id=0)
        with pytest.raises(VocabularyError, match=r"FakeTokenizer\('fake-model'\).*neither"):
            Vocabulary.from_huggingface(tokenizer)

    def test_missing_eos_is_rejected(self) -> None:
        tokenizer = FakeTokenizer(pieces=["Ġa", "b"])
        with pytest.raises(VocabularyError, match="no eos token"):
            Vocabulary.from_huggingface(tokenizer)

    def test_eos_out_of_range_names_the_id(self) -> None:
        tokenizer = FakeTokenizer(pieces=["Ġa", "b"], eos_token_id=7)
        with pytest.raises(VocabularyError, match=r"eos_token_id 7 is outside"):
            Vocabulary.from_huggingface(tokenizer)

    def test_non_tokenizer_is_rejected(self) -> None:
        with pytest.raises(VocabularyError, match="not a usable Hugging Face tokenizer"):
            Vocabulary.from_huggingface(object())


def test_core_imports_no_heavy_packages() -> None:
    # The formline this run imports (the installed one, with its compiled kernel), not the
    # src/ beside this file: CI runs the tests from a copy whose src/ has no built extension.
    source = pathlib.Path(formline.__file__).resolve().parents[1]
    code = (
        "import sys\n"
        "import formline.vocab, formline.vocab.huggingface, formline.vocab.gguf_reader\n"
        "import formline.vocab.fixtures\n"
        "heavy = {'torch', 'transformers', 'tokenizers', 'llama_cpp', 'gguf'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    environment = {
        **os.environ,
        "PYTHONPATH": f"{source}{os.pathsep}" + os.environ.get("PYTHONPATH", ""),
    }
    subprocess.run([sys.executable, "-c", code], check=True, env=environment)


@pytest.mark.parametrize(
    ("name", "added", "written"),
    [
        # Byte-level: the decoder maps the content's characters as byte-level pieces.
        ("smollm2", ["ĠĠfoo", "café"], [b"  foo", "caf\ufffd".encode()]),
        # SentencePiece: ▁ is a space once decoded (Gemma's added space runs).
        ("phi-3", ["x▁y"], [b" x y"]),
    ],
)
def test_ordinary_added_tokens_write_what_the_decoder_writes(
    name: str, added: list[str], written: list[bytes]
) -> None:
    # Their content's bytes were taken as written: "ĠĠfoo" as b"\xc4\xa0\xc4\xa0foo".
    from transformers import AutoTokenizer

    path = fixture_path(name)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tokenizer.add_tokens(added)  # not special
    vocabulary = Vocabulary.from_huggingface(tokenizer)
    for text, expected in zip(added, written, strict=True):
        token_id = tokenizer.convert_tokens_to_ids(text)
        assert token_id not in vocabulary.special_ids
        assert vocabulary.token_bytes[token_id] == expected, text


def test_a_failing_decode_leaves_the_added_content() -> None:
    from formline.vocab.huggingface import _written_in_context

    class Tokenizer:
        def __init__(self, prefix: list[int]) -> None:
            self.prefix = prefix

        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            return self.prefix

        def decode(self, ids: list[int], **options: Any) -> str:
            if ids[-1] == 7:
                raise KeyError(7)
            return "a" + " x" * (len(ids) - 1)

    assert _written_in_context(Tokenizer([1]), [5, 7]) == {5: b" x"}  # 7 keeps its content
    assert _written_in_context(Tokenizer([]), [5]) == {}  # no prefix: nothing to read after


def test_added_tokens_past_the_logits_are_left_out(smollm2_vocab: Vocabulary) -> None:
    # transformers' GGUF loader adds <|endoftext|> (an eos by llama.cpp's rules) as id
    # 128256 to Llama-3's 128,256 logits: the transformers backend refused Llama-3 as a
    # tokenizer that disagrees with its model. Added tokens past the logits, which no model
    # can write, are left out; a base token past them still refuses.
    from transformers import AutoTokenizer

    path = fixture_path("smollm2")  # a fresh tokenizer: tokens are added to it
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|extra|>"]})
    tokenizer.add_tokens(["plain extra", "<|endoftext|>"])
    assert len(tokenizer) == smollm2_vocab.size + 2  # <|endoftext|> is id 0 already
    vocabulary = Vocabulary.from_huggingface(tokenizer, smollm2_vocab.size)
    assert vocabulary.fingerprint() == smollm2_vocab.fingerprint()
    with pytest.raises(VocabularyError, match=r"ids 49151\.\.49153 would have no logit"):
        Vocabulary.from_huggingface(tokenizer, smollm2_vocab.size - 1)


@pytest.mark.slow
def test_llama3_through_transformers_matches_its_gguf() -> None:
    from transformers import AutoTokenizer

    path = fixture_path("llama-bpe")
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    assert len(tokenizer) == 128_257  # <|endoftext|>, added by transformers' GGUF loader
    vocabulary = Vocabulary.from_huggingface(tokenizer, 128_256)
    assert vocabulary.fingerprint() == Vocabulary.from_gguf(path).fingerprint()
