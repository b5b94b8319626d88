"""Vocabulary.from_gguf: real fixtures, synthetic GGUF files, and corrupt input."""

from __future__ import annotations

import pathlib
import struct
import tracemalloc
from collections.abc import Sequence

import gguf
import pytest

from formline.vocab import Vocabulary, VocabularyError
from formline.vocab.byte_decoding import bytes_to_unicode
from formline.vocab.fixtures import fixture_path
from formline.vocab.gguf_reader import read_gguf_tokenizer

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = range(1, 7)


def write_gguf(
    path: pathlib.Path,
    model: str,
    tokens: Sequence[str],
    token_types: Sequence[int] | None,
    eos_token_id: int | None = 0,
    *,
    eot_token_id: int | None = None,
    endianess: gguf.GGUFEndian = gguf.GGUFEndian.LITTLE,
) -> pathlib.Path:
    """Write a vocabulary-only GGUF file with the given tokenizer keys."""
    writer = gguf.GGUFWriter(path, "llama", endianess=endianess)
    writer.add_uint32("llama.context_length", 128)  # a key before and after the tokenizer
    writer.add_tokenizer_model(model)
    writer.add_token_list(list(tokens))
    if token_types is not None:
        writer.add_token_types(list(token_types))
    writer.add_array("tokenizer.ggml.merges", ["a b", "ab c"])
    if eos_token_id is not None:
        writer.add_eos_token_id(eos_token_id)
    if eot_token_id is not None:
        writer.add_eot_token_id(eot_token_id)
    writer.add_string("general.trailing", "end")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def text(value: bytes) -> bytes:
    """A GGUF string: its uint64 length, then its bytes."""
    return struct.pack("<Q", len(value)) + value


def entry(key: bytes, value_type: int, payload: bytes) -> bytes:
    """One GGUF key/value pair, its value already encoded."""
    return text(key) + struct.pack("<I", value_type) + payload


def token_list(tokens: list[bytes]) -> bytes:
    """A GGUF array of strings."""
    return struct.pack("<IQ", 8, len(tokens)) + b"".join(text(t) for t in tokens)


def gpt2_tokenizer(tokens: list[bytes]) -> list[bytes]:
    """The model and tokens keys of a byte-level vocabulary, encoded by hand."""
    return [
        entry(b"tokenizer.ggml.model", 8, text(b"gpt2")),
        entry(b"tokenizer.ggml.tokens", 9, token_list(tokens)),
    ]


def write_entries(path: pathlib.Path, entries: list[bytes]) -> pathlib.Path:
    """A GGUF file of these key/value pairs and no tensors (crafted: gguf's writer checks)."""
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(entries)) + b"".join(entries))
    return path


def byte_level(text: str) -> str:
    return "".join(bytes_to_unicode()[byte] for byte in text.encode())


class TestSyntheticByteLevel:
    TOKENS = (
        "<|endoftext|>",
        byte_level(" hello"),
        byte_level("\n"),
        byte_level("é")[:1],  # first byte of a two-byte character only
        "<|im_end|>",
        "<tool>",
        "[PAD6]",
        "<|unused|>",
    )
    TYPES = (CONTROL, NORMAL, NORMAL, NORMAL, CONTROL, USER_DEFINED, USER_DEFINED, UNUSED)

    def test_token_types_map_to_bytes_and_special_ids(self, tmp_path: pathlib.Path) -> None:
        path = write_gguf(tmp_path / "tiny.gguf", "gpt2", self.TOKENS, self.TYPES)
        vocabulary = Vocabulary.from_gguf(path)
        assert vocabulary.name == "tiny"
        assert vocabulary.token_bytes == (
            b"<|endoftext|>",
            b" hello",
            b"\n",
            b"\xc3",
            b"<|im_end|>",
            b"<tool>",  # user-defined: plain text, allowed
            b"",  # [PAD6]: converter padding
            b"<|unused|>",
        )
        # eos 0 is declared; <|im_end|> is a CONTROL end-of-generation marker.
        assert vocabulary.eos_ids == frozenset({0, 4})
        assert vocabulary.special_ids == frozenset({0, 4, 6, 7})
        assert vocabulary.token_id(b"<tool>") == 5

    def test_big_endian_file_reads_the_same(self, tmp_path: pathlib.Path) -> None:
        little = write_gguf(tmp_path / "le.gguf", "gpt2", self.TOKENS, self.TYPES)
        big = write_gguf(
            tmp_path / "be.gguf", "gpt2", self.TOKENS, self.TYPES, endianess=gguf.GGUFEndian.BIG
        )
        assert little.read_bytes() != big.read_bytes()
        assert Vocabulary.from_gguf(little).fingerprint() == Vocabulary.from_gguf(big).fingerprint()

    def test_eot_token_is_an_eos(self, tmp_path: pathlib.Path) -> None:
        path = write_gguf(tmp_path / "t.gguf", "gpt2", self.TOKENS, self.TYPES, eot_token_id=7)
        assert Vocabulary.from_gguf(path).eos_ids == frozenset({0, 4, 7})

    def test_unknown_token_type_number_is_special(self, tmp_path: pathlib.Path) -> None:
        path = write_gguf(tmp_path / "t.gguf", "gpt2", ["e", "x", "y"], [CONTROL, 0, 7])
        assert Vocabulary.from_gguf(path).special_ids == frozenset({0, 1, 2})

    def test_token_type_count_mismatch(self, tmp_path: pathlib.Path) -> None:
        path = write_gguf(tmp_path / "t.gguf", "gpt2", ["e", "x", "y"], [CONTROL, NORMAL])
        with pytest.raises(VocabularyError, match=r"token_type has 2 entries .* has 3"):
            Vocabulary.from_gguf(path)

    def test_missing_token_types_mean_normal(self, tmp_path: pathlib.Path) -> None:
        path = write_gguf(tmp_path / "t.gguf", "gpt2", ["x", byte_level(" y")], None)
        vocabulary = Vocabulary.from_gguf(path)
        assert vocabulary.token_bytes == (b"x", b" y")
        assert vocabulary.special_ids == frozenset({0})


class TestSyntheticSentencePiece:
    def test_spaces_and_byte_tokens(self, tmp_path: pathlib.Path) -> None:
        tokens = ["<unk>", "<s>", "</s>", "<0x0A>", "<0xE2>", "▁hello", "▁▁", "日本", "<|user|>"]
        types = [UNKNOWN, CONTROL, CONTROL, BYTE, BYTE, NORMAL, NORMAL, NORMAL, USER_DEFINED]
        path = write_gguf(tmp_path / "spm.gguf", "llama", tokens, types, eos_token_id=2)
        vocabulary = Vocabulary.from_gguf(path)
        assert vocabulary.token_bytes[3:] == (
            b"\n",
            b"\xe2",
            b" hello",
            b"  ",
            "日本".encode(),
            b"<|user|>",
        )
        assert vocabulary.eos_ids == frozenset({2})
        assert vocabulary.special_ids == frozenset({0, 1, 2})

    def test_malformed_byte_token_names_the_id(self, tmp_path: pathlib.Path) -> None:
        path = write_gguf(tmp_path / "bad.gguf", "llama", ["</s>", "<0xZZ>"], [CONTROL, BYTE])
        with pytest.raises(VocabularyError, match=r"bad\.gguf.*token 1 has type BYTE"):
            Vocabulary.from_gguf(path)


class TestErrors:
    def test_unsupported_model_is_named(self, tmp_path: pathlib.Path) -> None:
        path = write_gguf(tmp_path / "bert.gguf", "bert", ["[CLS]", "hello"], [CONTROL, NORMAL])
        with pytest.raises(
            VocabularyError, match=r"bert\.gguf.*unsupported tokenizer model 'bert'"
        ):
            Vocabulary.from_gguf(path)

    def test_missing_file(self, tmp_path: pathlib.Path) -> None:
        with pytest.raises(VocabularyError, match=r"nowhere\.gguf"):
            Vocabulary.from_gguf(tmp_path / "nowhere.gguf")

    @pytest.mark.parametrize("content", [b"", b"not a gguf file at all, just text", b"GGUF"])
    def test_not_gguf(self, tmp_path: pathlib.Path, content: bytes) -> None:
        path = tmp_path / "junk.gguf"
        path.write_bytes(content)
        with pytest.raises(VocabularyError, match=r"junk\.gguf"):
            Vocabulary.from_gguf(path)

    @pytest.mark.parametrize("keep_fraction", [0.01, 0.3, 0.9])
    def test_truncated_file(self, tmp_path: pathlib.Path, keep_fraction: float) -> None:
        original = fixture_path("phi-3").read_bytes()
        path = tmp_path / "truncated.gguf"
        path.write_bytes(original[: int(len(original) * keep_fraction)])
        with pytest.raises(VocabularyError, match=r"truncated\.gguf: corrupt GGUF"):
            Vocabulary.from_gguf(path)

    def test_no_tokenizer_keys(self, tmp_path: pathlib.Path) -> None:
        writer = gguf.GGUFWriter(tmp_path / "weights.gguf", "llama")
        writer.add_uint32("llama.context_length", 128)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        with pytest.raises(VocabularyError, match=r"weights\.gguf.*tokenizer\.ggml\.model"):
            Vocabulary.from_gguf(tmp_path / "weights.gguf")

    def test_eos_out_of_range(self, tmp_path: pathlib.Path) -> None:
        path = write_gguf(tmp_path / "e.gguf", "gpt2", ["a", "b"], [NORMAL, NORMAL], eos_token_id=9)
        with pytest.raises(VocabularyError, match=r"e\.gguf.*eos_token_id = 9"):
            Vocabulary.from_gguf(path)

    def test_nested_arrays_and_repeated_keys_are_named(self, tmp_path: pathlib.Path) -> None:
        # Crafted by hand: gguf's writer makes neither. 5,000 nested arrays raised
        # RecursionError; a second token list replaced the first without a word.
        tokenizer = [
            entry(b"tokenizer.ggml.model", 8, text(b"gpt2")),
            entry(b"tokenizer.ggml.tokens", 9, token_list([b"a", b"b"])),
            entry(b"tokenizer.ggml.eos_token_id", 4, struct.pack("<I", 1)),
        ]
        nested = struct.pack("<IQ", 9, 1) * 5_000 + struct.pack("<IQ", 4, 0)
        cases = {
            "nested": ([entry(b"x", 9, nested), *tokenizer], "arrays nested more than 4 deep"),
            "twice": (
                [*tokenizer, entry(b"tokenizer.ggml.tokens", 9, token_list([b"z"] * 3))],
                "'tokenizer.ggml.tokens' appears twice",
            ),
        }
        for name, (entries, message) in cases.items():
            with pytest.raises(VocabularyError, match=message):
                Vocabulary.from_gguf(write_entries(tmp_path / f"{name}.gguf", entries))

    @pytest.mark.parametrize(
        ("tokens", "message"),
        [
            (entry(b"tokenizer.ggml.tokens", 4, struct.pack("<I", 5)), "not an array of strings"),
            (entry(b"tokenizer.ggml.tokens", 9, struct.pack("<IQ", 4, 0)), "array of strings"),
        ],
        ids=["a number", "an array of numbers"],
    )
    def test_tokens_that_are_not_strings_are_named(
        self, tmp_path: pathlib.Path, tokens: bytes, message: str
    ) -> None:
        # A number with no token_type key raised TypeError: object of type 'int' has no len()
        model = entry(b"tokenizer.ggml.model", 8, text(b"gpt2"))
        with pytest.raises(VocabularyError, match=message):
            Vocabulary.from_gguf(write_entries(tmp_path / "t.gguf", [model, tokens]))

    @pytest.mark.parametrize(
        ("payload", "message"),
        [
            (struct.pack("<IQ", 5, 0), "token_type has 0 entries but tokenizer.ggml.tokens has 2"),
            (struct.pack("<IQ", 8, 0), "token_type is not an array of integers"),
        ],
        ids=["empty numbers", "empty strings"],
    )
    def test_empty_token_types_are_an_error(
        self, tmp_path: pathlib.Path, payload: bytes, message: str
    ) -> None:
        # An empty array was read as "no key": every token NORMAL, "<s>" allowed as text
        entries = [*gpt2_tokenizer([b"<s>", b"a"]), entry(b"tokenizer.ggml.token_type", 9, payload)]
        with pytest.raises(VocabularyError, match=message):
            Vocabulary.from_gguf(write_entries(tmp_path / "t.gguf", entries))

    def test_a_huge_token_type_array_is_read_in_bounded_memory(
        self, tmp_path: pathlib.Path
    ) -> None:
        # A corrupt count made token_type 8 million uint8s: read as a tuple then a list they
        # took 16 bytes each (128 MB for an 8 MB file) before the length check refused them
        count = 8_000_000
        huge = entry(b"tokenizer.ggml.token_type", 9, struct.pack("<IQ", 0, count) + bytes(count))
        path = write_entries(tmp_path / "huge.gguf", [*gpt2_tokenizer([b"a", b"b"]), huge])
        tracemalloc.start()
        try:
            with pytest.raises(VocabularyError, match="token_type has 8000000 entries"):
                Vocabulary.from_gguf(path)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 3 * count, peak  # one copy of the array and change


class TestSmolLM2:
    def test_shape_and_specials(self, smollm2_vocab: Vocabulary) -> None:
        assert smollm2_vocab.size == 49_152
        # 17 CONTROL tokens (ids 0..16: <|endoftext|>, <|im_start|>, <|im_end|>, <repo_name>...)
        assert smollm2_vocab.special_ids == frozenset(range(17))
        # eos_token_id = 2 (<|im_end|>); <|endoftext|> (0) ends a generation, and so does
        # <reponame> (4), a fill-in-the-middle repo marker, as in llama.cpp
        assert smollm2_vocab.eos_ids == frozenset({0, 2, 4})
        assert smollm2_vocab.token_bytes[1] == b"<|im_start|>"

    def test_byte_level_pieces(self, smollm2_vocab: Vocabulary) -> None:
        assert smollm2_vocab.token_id(b" world") is not None
        assert smollm2_vocab.token_id(b"\n") is not None
        single_bytes = {piece[0] for piece in smollm2_vocab.token_bytes if len(piece) == 1}
        # SmolLM2's BPE was trained without some bytes: six rare control characters
        # and UTF-8 lead bytes 0xF1/0xF2 (planes 4..11) have no token at all, and
        # never-valid bytes 0xC0, 0xC1, 0xF5..0xFF neither. Text with these bytes
        # cannot be generated by this model.
        missing = {0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2, *range(0xF5, 256)}
        assert single_bytes == set(range(256)) - missing
        assert not any(value in missing for piece in smollm2_vocab.token_bytes for value in piece)

    def test_vocab_size_padding(self, smollm2_vocab: Vocabulary) -> None:
        padded = Vocabulary.from_gguf(fixture_path("smollm2"), vocab_size=49_152 + 64)
        assert padded.size == 49_216
        assert padded.token_bytes[:49_152] == smollm2_vocab.token_bytes
        assert padded.token_bytes[49_152:] == (b"",) * 64
        assert set(range(49_152, 49_216)) <= padded.special_ids
        assert padded.fingerprint() != smollm2_vocab.fingerprint()

    def test_vocab_size_too_small_names_the_file(self) -> None:
        with pytest.raises(VocabularyError, match=r"SmolLM2.*vocab_size 1000 is smaller"):
            Vocabulary.from_gguf(fixture_path("smollm2"), vocab_size=1000)


class TestPhi3:
    def test_shape_and_specials(self, phi3_vocab: Vocabulary) -> None:
        assert phi3_vocab.size == 32_064
        # eos_token_id = 32000 <|endoftext|>; <|end|> (32007) ends a chat turn; </s> (2) is
        # USER_DEFINED in this file, but llama.cpp makes it a control token that stops
        assert phi3_vocab.eos_ids == frozenset({2, 32_000, 32_007})
        # <unk>, <s> (CONTROL), </s>, 32000..32010 (CONTROL), [PAD32011..32063] (UNKNOWN)
        assert phi3_vocab.special_ids == frozenset({0, 1, 2, *range(32_000, 32_064)})
        assert phi3_vocab.token_bytes[32_011:] == (b"",) * 53

    def test_byte_fallback_tokens_are_single_bytes(self, phi3_vocab: Vocabulary) -> None:
        tokenizer = read_gguf_tokenizer(fixture_path("phi-3"))
        byte_ids = [i for i, kind in enumerate(tokenizer.token_types) if kind == BYTE]
        assert len(byte_ids) == 256
        assert [phi3_vocab.token_bytes[i] for i in byte_ids] == [bytes((v,)) for v in range(256)]

    def test_spaces(self, phi3_vocab: Vocabulary) -> None:
        tokenizer = read_gguf_tokenizer(fixture_path("phi-3"))
        hello = tokenizer.tokens.index("▁hello".encode())
        assert phi3_vocab.token_bytes[hello] == b" hello"
        assert not any("▁".encode() in piece for piece in phi3_vocab.token_bytes)


class TestQwen2:
    def test_shape_and_specials(self, qwen2_vocab: Vocabulary) -> None:
        assert qwen2_vocab.size == 151_936
        # endoftext, im_end, and a normal "</s>" (128247) that llama.cpp makes a stop
        assert qwen2_vocab.eos_ids == frozenset({128_247, 151_643, 151_645})
        # 3 CONTROL tokens, then 290 USER_DEFINED "[PAD151646]".. fillers treated as padding
        assert qwen2_vocab.special_ids == frozenset({128_247, *range(151_643, 151_936)})
        assert qwen2_vocab.token_bytes[151_644] == b"<|im_start|>"
        assert qwen2_vocab.token_bytes[151_646:] == (b"",) * 290
        single_bytes = {piece for piece in qwen2_vocab.token_bytes if len(piece) == 1}
        assert single_bytes == {bytes((value,)) for value in range(256)}


@pytest.mark.parametrize(
    ("name", "size", "eos_texts"),
    [
        ("gpt-2", 50_257, {b"<|endoftext|>"}),
        ("llama-bpe", 128_256, {b"<|end_of_text|>", b"<|eot_id|>"}),
        ("llama-spm", 32_000, {b"</s>"}),
    ],
)
def test_other_fixtures(name: str, size: int, eos_texts: set[bytes]) -> None:
    vocabulary = Vocabulary.from_gguf(fixture_path(name))
    assert vocabulary.size == size
    assert {vocabulary.token_bytes[i] for i in vocabulary.eos_ids} == eos_texts
    assert vocabulary.token_id(b" the") is not None
