"""Vocabulary construction, validation, fingerprint and lookup (no fixtures needed)."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from formline.vocab import Vocabulary, VocabularyError
from formline.vocab.byte_decoding import (
    byte_fallback_value,
    bytes_to_unicode,
    decode_byte_level_piece,
    decode_sentencepiece_piece,
    unicode_to_bytes,
)


def small_vocabulary(**overrides: object) -> Vocabulary:
    arguments: dict[str, object] = {
        "tokens": ["<eos>", "a", "b", "ab", "é", b"\xff"],
        "eos_ids": [0],
        "special_ids": [],
    }
    arguments.update(overrides)
    return Vocabulary.from_list(**arguments)  # type: ignore[arg-type]


class TestFromList:
    def test_strings_are_utf8_and_bytes_are_kept(self) -> None:
        vocabulary = small_vocabulary()
        assert vocabulary.token_bytes == (b"<eos>", b"a", b"b", b"ab", b"\xc3\xa9", b"\xff")
        assert vocabulary.size == 6
        assert vocabulary.eos_ids == frozenset({0})

    def test_eos_ids_are_special(self) -> None:
        vocabulary = small_vocabulary(special_ids=[5])
        assert vocabulary.special_ids == frozenset({0, 5})

    def test_padding_to_vocab_size_adds_empty_special_ids(self) -> None:
        vocabulary = small_vocabulary(vocab_size=9, name="padded")
        assert vocabulary.size == 9
        assert vocabulary.token_bytes[6:] == (b"", b"", b"")
        assert {6, 7, 8} <= vocabulary.special_ids
        assert vocabulary.name == "padded"

    def test_vocab_size_equal_to_token_count_adds_nothing(self) -> None:
        vocabulary = small_vocabulary(vocab_size=6)
        assert vocabulary.size == 6
        assert vocabulary.special_ids == frozenset({0})

    def test_vocab_size_smaller_than_tokens_is_an_error(self) -> None:
        with pytest.raises(VocabularyError, match=r"vocab_size 4 is smaller .* 6 tokens"):
            small_vocabulary(vocab_size=4)

    @pytest.mark.parametrize("bad_id", [6, -1, 100])
    def test_eos_id_out_of_range_names_the_id(self, bad_id: int) -> None:
        with pytest.raises(VocabularyError, match=rf"eos id {bad_id} is out of range"):
            small_vocabulary(eos_ids=[0, bad_id])

    def test_special_id_out_of_range_names_the_id(self) -> None:
        with pytest.raises(VocabularyError, match=r"special id 17 is out of range.*0\.\.5"):
            small_vocabulary(special_ids=[17])

    def test_eos_id_may_address_a_padding_id(self) -> None:
        vocabulary = small_vocabulary(eos_ids=[7], vocab_size=8)
        assert vocabulary.eos_ids == frozenset({7})

    def test_no_eos_is_an_error(self) -> None:
        with pytest.raises(VocabularyError, match="eos"):
            small_vocabulary(eos_ids=[])

    def test_non_integer_ids_are_rejected(self) -> None:
        with pytest.raises(VocabularyError, match=r"eos id '1' is not an integer"):
            small_vocabulary(eos_ids=["1"])
        with pytest.raises(VocabularyError, match="bool"):
            small_vocabulary(eos_ids=[True])

    def test_bad_token_type_names_the_id(self) -> None:
        with pytest.raises(VocabularyError, match=r"token 2 is int"):
            small_vocabulary(tokens=["a", "b", 3])


class TestDirectConstruction:
    def test_post_init_normalises_and_validates(self) -> None:
        vocabulary = Vocabulary([b"x", b"y"], {1}, set())  # type: ignore[arg-type]
        assert vocabulary.token_bytes == (b"x", b"y")
        assert isinstance(vocabulary.eos_ids, frozenset)
        assert vocabulary.special_ids == frozenset({1})

    def test_post_init_rejects_str_tokens(self) -> None:
        with pytest.raises(VocabularyError, match=r"token 1 is str"):
            Vocabulary((b"x", "y"), frozenset({0}), frozenset())  # type: ignore[arg-type]

    def test_post_init_rejects_out_of_range_eos(self) -> None:
        with pytest.raises(VocabularyError, match=r"eos id 2 is out of range"):
            Vocabulary((b"x", b"y"), frozenset({2}), frozenset())

    def test_is_frozen(self) -> None:
        vocabulary = small_vocabulary()
        with pytest.raises(AttributeError):
            vocabulary.name = "other"  # type: ignore[misc]

    def test_repr_is_short(self) -> None:
        text = repr(small_vocabulary(vocab_size=100_000, name="big"))
        assert "big" in text and "100000" in text and len(text) < 200


class TestFingerprint:
    def test_stable_and_cached(self) -> None:
        first = small_vocabulary()
        second = small_vocabulary(name="another name")
        assert first.fingerprint() == second.fingerprint()  # name is not part of it
        assert first.fingerprint() is first.fingerprint()
        assert len(first.fingerprint()) == 64
        int(first.fingerprint(), 16)

    def test_survives_pickling(self) -> None:
        vocabulary = small_vocabulary()
        fingerprint = vocabulary.fingerprint()
        restored = pickle.loads(pickle.dumps(vocabulary))
        assert restored.fingerprint() == fingerprint
        assert restored.token_bytes == vocabulary.token_bytes

    @pytest.mark.parametrize(
        "overrides",
        [
            {"tokens": ["<eos>", "a", "b", "ab", "é", b"\xfe"]},  # one byte changed
            {"tokens": ["<eos>", "a", "b", "ab", "é"]},  # one token fewer
            {"tokens": ["<eos>", "ab", "", "ab", "é", b"\xff"]},  # same concatenation
            {"eos_ids": [0, 1]},
            {"special_ids": [3]},
            {"vocab_size": 7},
        ],
    )
    def test_sensitive_to_every_component(self, overrides: dict[str, object]) -> None:
        assert small_vocabulary(**overrides).fingerprint() != small_vocabulary().fingerprint()

    @given(st.lists(st.binary(max_size=4), min_size=1, max_size=12), st.data())
    def test_equal_inputs_give_equal_fingerprints(
        self, tokens: list[bytes], data: st.DataObject
    ) -> None:
        eos = data.draw(st.integers(0, len(tokens) - 1))
        first = Vocabulary.from_list(tokens, [eos])
        second = Vocabulary.from_list(list(tokens), {eos})
        assert first.fingerprint() == second.fingerprint()

    @given(st.lists(st.binary(max_size=3), min_size=2, max_size=8, unique=True))
    def test_moving_a_token_boundary_changes_fingerprint(self, tokens: list[bytes]) -> None:
        merged = [tokens[0] + tokens[1], b"", *tokens[2:]]
        if merged == tokens:
            return
        assert (
            Vocabulary.from_list(tokens, [0]).fingerprint()
            != Vocabulary.from_list(merged, [0]).fingerprint()
        )


class TestTokenId:
    def test_finds_non_special_tokens(self) -> None:
        vocabulary = small_vocabulary()
        assert vocabulary.token_id(b"a") == 1
        assert vocabulary.token_id(b"ab") == 3
        assert vocabulary.token_id("é".encode()) == 4
        assert vocabulary.token_id(b"\xff") == 5

    def test_first_id_wins(self) -> None:
        vocabulary = Vocabulary.from_list(["e", "x", "y", "x"], [0])
        assert vocabulary.token_id(b"x") == 1

    def test_special_empty_and_unknown_pieces_are_none(self) -> None:
        vocabulary = small_vocabulary(vocab_size=8)
        assert vocabulary.token_id(b"<eos>") is None
        assert vocabulary.token_id(b"") is None
        assert vocabulary.token_id(b"zz") is None

    def test_special_duplicate_falls_through_to_normal_id(self) -> None:
        vocabulary = Vocabulary.from_list(["<s>", "x", "<s>"], [0])
        assert vocabulary.token_id(b"<s>") == 2


class TestByteDecoding:
    def test_gpt2_map_is_a_bijection_onto_printable_characters(self) -> None:
        mapping = bytes_to_unicode()
        assert sorted(mapping) == list(range(256))
        assert len(set(mapping.values())) == 256
        assert all(
            character.isprintable() and not character.isspace() for character in mapping.values()
        )
        assert mapping[ord(" ")] == "Ġ" and mapping[ord("\n")] == "Ċ" and mapping[ord("a")] == "a"
        assert unicode_to_bytes()["Ġ"] == 0x20

    @given(st.binary(max_size=20))
    def test_byte_level_round_trip(self, data: bytes) -> None:
        piece = "".join(bytes_to_unicode()[byte] for byte in data)
        assert decode_byte_level_piece(piece) == data

    def test_byte_level_piece_outside_alphabet_is_taken_as_utf8(self) -> None:
        # Raw space / U+00A0 never appear in byte-level pieces; such a piece (an added
        # token, say) decodes as its own text, as the HF ByteLevel decoder does.
        assert decode_byte_level_piece("a b") == b"a b"
        assert decode_byte_level_piece("x\u00a0") == "x\u00a0".encode()
        assert decode_byte_level_piece("日本") == "日本".encode()

    def test_sentencepiece_pieces(self) -> None:
        assert decode_sentencepiece_piece("▁hello") == b" hello"
        assert decode_sentencepiece_piece("▁▁") == b"  "
        assert decode_sentencepiece_piece("<0x0A>") == b"\n"
        assert decode_sentencepiece_piece("<0xE2>") == b"\xe2"
        assert decode_sentencepiece_piece("<0xE2>", byte_fallback=False) == b"<0xE2>"
        assert decode_sentencepiece_piece("日▁") == "日 ".encode()
        assert byte_fallback_value("<0xff>") == 255
        assert byte_fallback_value("<0x1>") is None
        assert byte_fallback_value("x<0x41>") is None


@given(st.lists(st.binary(max_size=4), min_size=1, max_size=40), st.integers(0, 255))
def test_tokens_with_a_byte_are_those_whose_bytes_hold_it(pieces: list[bytes], byte: int) -> None:
    vocabulary = Vocabulary.from_list([b"<eos>", *pieces], eos_ids=[0])
    ids = vocabulary.tokens_with_byte(byte)
    expected = [k for k, piece in enumerate(vocabulary.token_bytes) if byte in piece]
    assert ids.tolist() == expected  # the eos token's bytes too: special ids are not left out
    assert vocabulary.tokens_with_byte(byte) is ids and not ids.flags.writeable  # cached
    with pytest.raises(ValueError, match="0-255"):
        vocabulary.tokens_with_byte(256)
