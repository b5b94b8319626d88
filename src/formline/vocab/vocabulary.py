"""The model vocabulary as raw bytes: what each token id stands for in the output text.

A :class:`Vocabulary` is the only view of a tokenizer the rest of formline needs:
``token_bytes[i]`` is exactly the byte string token ``i`` contributes to the decoded
output when it appears in the middle of a sequence, ``eos_ids`` are the ids that
end generation, and ``special_ids`` are the ids a grammar may never produce as text.

This module imports nothing heavy: GGUF reading and the Hugging Face adapter are
imported only when ``from_gguf`` / ``from_huggingface`` are called.
"""

from __future__ import annotations

import functools
import hashlib
import operator
import os
import pathlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from formline.errors import FormlineError
from formline.vocab.prefix import TokenPrefixIndex

_FINGERPRINT_VERSION = b"formline-vocabulary-fingerprint-v1\x00"


class VocabularyError(FormlineError, ValueError):
    """A vocabulary cannot be built: bad ids, sizes, or an unsupported/corrupt tokenizer."""


def is_padding_piece(piece: str | bytes, token_id: int) -> bool:
    """Return True when ``piece`` is ``"[PAD<token_id>]"``, a converter-made filler token.

    llama.cpp's converter (and transformers' GGUF loader after it) fills the ids
    between the tokenizer's size and the model's logits size with such pieces; they
    have no text in the original tokenizer and are treated as padding.
    """
    expected = f"[PAD{token_id}]"
    if isinstance(piece, bytes):
        return piece == expected.encode()
    return piece == expected


def _as_token_id(value: Any, what: str, source: str) -> int:
    """Return ``value`` as an int id, or raise VocabularyError naming ``what``/``source``."""
    if isinstance(value, bool):
        raise VocabularyError(f"{source}: {what} {value!r} is a bool, not a token id")
    try:
        return operator.index(value)
    except TypeError:
        raise VocabularyError(f"{source}: {what} {value!r} is not an integer token id") from None


def _check_ids(ids: Iterable[Any], what: str, size: int, source: str) -> frozenset[int]:
    """Return ``ids`` as a frozenset after checking each is an int in ``range(size)``."""
    checked = set()
    for value in ids:
        token_id = _as_token_id(value, what, source)
        if not 0 <= token_id < size:
            raise VocabularyError(
                f"{source}: {what} {token_id} is out of range for a vocabulary of "
                f"{size} tokens (valid ids: 0..{size - 1})"
            )
        checked.add(token_id)
    return frozenset(checked)


@dataclass(frozen=True, eq=False)
class Vocabulary:
    """Token id → raw bytes, plus the eos and special id sets. Immutable.

    Attributes:
        token_bytes: index = token id; ``len`` is the model's logits size. ``b""`` for
            ids with no text (padding ids beyond the tokenizer).
        eos_ids: ids that end generation (at least one).
        special_ids: ids a grammar never allows as text: control/special tokens,
            padding ids, and every eos id (added automatically).
        name: a human label (e.g. the file stem); not part of the fingerprint.

    Construction raises VocabularyError when a token is not ``bytes``, ``eos_ids`` is
    empty, or an id is out of range. Equality is identity; compare fingerprints.
    """

    token_bytes: tuple[bytes, ...]
    eos_ids: frozenset[int]
    special_ids: frozenset[int]
    name: str = ""

    def __post_init__(self) -> None:
        source = f"Vocabulary {self.name!r}" if self.name else "Vocabulary"
        token_bytes = tuple(self.token_bytes)
        if not all(type(piece) is bytes for piece in token_bytes):
            for token_id, piece in enumerate(token_bytes):
                if type(piece) is not bytes:
                    raise VocabularyError(
                        f"{source}: token {token_id} is {type(piece).__name__}, not bytes"
                    )
        size = len(token_bytes)
        eos_ids = _check_ids(self.eos_ids, "eos id", size, source)
        if not eos_ids:
            raise VocabularyError(f"{source}: at least one eos id is required")
        special_ids = _check_ids(self.special_ids, "special id", size, source) | eos_ids
        object.__setattr__(self, "token_bytes", token_bytes)
        object.__setattr__(self, "eos_ids", eos_ids)
        object.__setattr__(self, "special_ids", special_ids)

    def __repr__(self) -> str:
        return (
            f"Vocabulary(name={self.name!r}, size={self.size}, "
            f"eos_ids={sorted(self.eos_ids)}, special_ids=<{len(self.special_ids)} ids>)"
        )

    @property
    def size(self) -> int:
        """The number of token ids (the model's logits size)."""
        return len(self.token_bytes)

    def fingerprint(self) -> str:
        """Return a SHA-256 hex digest of (token_bytes, eos_ids, special_ids).

        Equal for vocabularies that behave identically, whatever their name; any
        change of a token's bytes, the size, or the id sets changes it. Cost: O(total
        token bytes) on the first call (about 20 ms for 151k tokens), then cached.
        """
        return self._fingerprint

    @functools.cached_property
    def _fingerprint(self) -> str:
        digest = hashlib.sha256(_FINGERPRINT_VERSION)
        lengths = b"".join(len(piece).to_bytes(4, "little") for piece in self.token_bytes)
        for part in (
            len(self.token_bytes).to_bytes(8, "little"),
            lengths,
            b"".join(self.token_bytes),
            _encode_ids(self.eos_ids),
            _encode_ids(self.special_ids),
        ):
            digest.update(len(part).to_bytes(8, "little"))
            digest.update(part)
        return digest.hexdigest()

    def token_id(self, piece: bytes) -> int | None:
        """Return the lowest non-special id whose bytes are exactly ``piece``, else None.

        Empty pieces and special ids are never returned. Cost: builds a dict over the
        whole vocabulary on the first call (O(size)), then O(len(piece)) per lookup.
        """
        return self._id_by_piece.get(piece)

    def tokens_with_byte(self, byte: int) -> np.ndarray:
        """The ids of the tokens whose bytes hold ``byte`` (ascending, int64, read-only):
        what a per-step policy scans instead of every allowed token (a JSON string's item can
        close only in a token holding a quote: 163 of SmolLM2's 49,152 tokens, 1,345 of
        Llama-3's 128,256).

        Raises:
            ValueError: ``byte`` is not in 0-255.
        Cost: one vectorised pass over the vocabulary's bytes the first time for each byte
        (a few ms for 128k tokens), then cached.
        """
        if not 0 <= byte <= 255:
            raise ValueError(f"a byte is 0-255, not {byte}")
        known = self._tokens_with_byte.get(byte)
        if known is None:
            pieces = self.token_bytes
            ends = np.cumsum(np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces)))
            data = np.frombuffer(b"".join(pieces), dtype=np.uint8)
            # A byte at position p belongs to the first token whose end is past p.
            known = np.unique(np.searchsorted(ends, np.flatnonzero(data == byte), side="right"))
            known.setflags(write=False)
            self._tokens_with_byte[byte] = known
        return known

    @functools.cached_property
    def _tokens_with_byte(self) -> dict[int, np.ndarray]:
        return {}

    @functools.cached_property
    def prefix_index(self) -> TokenPrefixIndex:
        """The text tokens sorted by bytes (built on first use: one sort of the vocabulary)."""
        return TokenPrefixIndex(self.token_bytes, self.special_ids)

    @functools.cached_property
    def _id_by_piece(self) -> dict[bytes, int]:
        index: dict[bytes, int] = {}
        special_ids = self.special_ids
        for token_id, piece in enumerate(self.token_bytes):
            if piece and token_id not in special_ids:
                index.setdefault(piece, token_id)
        return index

    @classmethod
    def from_list(
        cls,
        tokens: Sequence[bytes | str],
        eos_ids: Iterable[int],
        special_ids: Iterable[int] = (),
        vocab_size: int | None = None,
        name: str = "",
    ) -> Vocabulary:
        """Build a vocabulary from token texts (``str`` is UTF-8 encoded) indexed by id.

        ``vocab_size`` larger than ``len(tokens)`` pads with ``b""`` ids that become
        special. Raises VocabularyError (naming the offending id or size) when a token
        is neither bytes nor str, ``vocab_size`` is smaller than ``len(tokens)``, or an
        eos/special id is out of range. Cost: O(total token length).
        """
        source = f"Vocabulary.from_list({name!r})" if name else "Vocabulary.from_list"
        token_bytes: list[bytes] = []
        for token_id, token in enumerate(tokens):
            if isinstance(token, str):
                token_bytes.append(token.encode("utf-8"))
            elif isinstance(token, bytes | bytearray | memoryview):
                token_bytes.append(bytes(token))
            else:
                raise VocabularyError(
                    f"{source}: token {token_id} is {type(token).__name__}, not bytes or str"
                )
        return build_vocabulary(token_bytes, eos_ids, special_ids, vocab_size, name, source)

    @classmethod
    def from_gguf(
        cls, path: str | os.PathLike[str], vocab_size: int | None = None, tokenizer: Any = None
    ) -> Vocabulary:
        """Read the tokenizer of a GGUF file (model or vocabulary-only file).

        Supports ``tokenizer.ggml.model`` ``"gpt2"`` (byte-level BPE) and ``"llama"``
        (SentencePiece); see ``gguf_reader.gguf_token_bytes`` for the per-type rules
        and how eos ids are chosen. ``name`` is the file stem. Raises VocabularyError
        naming the path for a missing/corrupt/non-GGUF file, another tokenizer model
        (e.g. ``"bert"``), or a ``vocab_size`` smaller than the token list. Cost: reads
        only the metadata header; about 0.1 s for a 151k-token vocabulary (plus about
        0.1 s for the first import of ``gguf``). ``tokenizer``: the file's header keys
        already read (:func:`~formline.vocab.gguf_reader.read_gguf_tokenizer`), not read
        again.
        """
        from formline.vocab.gguf_reader import gguf_token_bytes, read_gguf_tokenizer

        tokenizer = tokenizer or read_gguf_tokenizer(path)
        token_bytes, eos_ids, special_ids = gguf_token_bytes(tokenizer)
        name = pathlib.Path(path).stem
        return build_vocabulary(
            token_bytes, eos_ids, special_ids, vocab_size, name, source=os.fspath(path)
        )

    @classmethod
    def from_huggingface(cls, tokenizer: Any, vocab_size: int | None = None) -> Vocabulary:
        """Build a vocabulary from a Hugging Face tokenizer object (duck-typed).

        Needs ``len(tokenizer)`` and ``convert_ids_to_tokens``; uses
        ``added_tokens_decoder``, ``all_special_ids``, ``eos_token_id`` and
        ``backend_tokenizer.decoder`` when present. See
        ``huggingface.huggingface_token_bytes`` for the rules. Raises VocabularyError
        when the tokenizer is neither byte-level BPE nor SentencePiece, declares no eos
        token, or is larger than ``vocab_size`` in more than added tokens past the logits
        (no model can write those; an eos among them is dropped while another is left:
        transformers' GGUF loader adds ``<|endoftext|>``, an eos by llama.cpp's rules, as
        id 128256 to Llama-3's 128,256). Cost: O(vocabulary size),
        about 0.15 s for 151k tokens (a fast tokenizer's ``convert_ids_to_tokens`` plus
        decoding).
        """
        from formline.vocab.huggingface import huggingface_token_bytes, tokenizer_name

        token_bytes, eos_ids, special_ids = huggingface_token_bytes(tokenizer)
        if isinstance(vocab_size, int) and 0 < vocab_size < len(token_bytes):
            past = set(range(vocab_size, len(token_bytes)))
            added = getattr(tokenizer, "added_tokens_decoder", None) or {}
            if past <= set(added) and eos_ids - past:
                token_bytes, special_ids = token_bytes[:vocab_size], special_ids - past
                eos_ids = eos_ids - past
        name = tokenizer_name(tokenizer)
        source = f"{type(tokenizer).__name__}({name!r})"
        return build_vocabulary(token_bytes, eos_ids, special_ids, vocab_size, name, source)


def _encode_ids(ids: frozenset[int]) -> bytes:
    return b"".join(token_id.to_bytes(8, "little") for token_id in sorted(ids))


def build_vocabulary(
    token_bytes: list[bytes],
    eos_ids: Iterable[int],
    special_ids: Iterable[int],
    vocab_size: int | None,
    name: str,
    source: str,
) -> Vocabulary:
    """Pad ``token_bytes`` to ``vocab_size`` (padding ids become special) and build.

    Raises VocabularyError naming ``source`` when ``vocab_size`` is smaller than the
    token list or not a positive integer, or when an id is out of range. Cost: O(size).
    """
    special = set(special_ids)
    if vocab_size is not None:
        vocab_size = _as_token_id(vocab_size, "vocab_size", source)
        if vocab_size < len(token_bytes):
            raise VocabularyError(
                f"{source}: vocab_size {vocab_size} is smaller than the tokenizer's "
                f"{len(token_bytes)} tokens (ids {vocab_size}..{len(token_bytes) - 1} "
                "would have no logit)"
            )
        special.update(range(len(token_bytes), vocab_size))
        token_bytes = token_bytes + [b""] * (vocab_size - len(token_bytes))
    size = len(token_bytes)
    checked_eos = _check_ids(eos_ids, "eos id", size, source)
    if not checked_eos:
        raise VocabularyError(f"{source}: no eos id (at least one is required)")
    checked_special = _check_ids(special, "special id", size, source)
    return Vocabulary(tuple(token_bytes), checked_eos, checked_special, name)
