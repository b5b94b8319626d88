"""Duck-typed adapter from a Hugging Face tokenizer object to token bytes.

Nothing from ``transformers``, ``tokenizers`` or ``torch`` is imported: only the
object passed in is used, through these attributes (the optional ones are looked up
with ``getattr``):

* ``len(tokenizer)`` and ``convert_ids_to_tokens(list_of_ids)`` (required);
* ``added_tokens_decoder`` (``{id: AddedToken}`` with ``.content`` and ``.special``);
* ``all_special_ids``, ``eos_token_id``;
* ``backend_tokenizer.decoder`` (fast tokenizers), whose ``str()`` names its parts,
  e.g. ``ByteLevel(...)`` or ``Sequence(decoders=[Replace(...▁...), ByteFallback(), ...])``.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable
from typing import Any

from formline.vocab.byte_decoding import (
    SENTENCEPIECE_SPACE,
    decode_byte_level_piece,
    decode_sentencepiece_piece,
    is_byte_level_piece,
)
from formline.vocab.special_texts import read_text_rules
from formline.vocab.vocabulary import (
    VocabularyError,
    is_padding_piece,
)

BYTE_LEVEL = "byte-level"
SENTENCEPIECE = "sentencepiece"


def tokenizer_name(tokenizer: Any) -> str:
    """Return a short label: the last component of ``name_or_path`` (or "")."""
    name_or_path = str(getattr(tokenizer, "name_or_path", "") or "")
    name = os.path.basename(name_or_path.rstrip("/\\"))
    return "" if name in (".", "..") else name


def _added_tokens(tokenizer: Any) -> dict[int, tuple[str, bool]]:
    """Return ``{id: (content, special)}`` from ``added_tokens_decoder`` (may be empty)."""
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    added: dict[int, tuple[str, bool]] = {}
    for token_id, token in decoder.items():
        content = getattr(token, "content", token)
        added[operator.index(token_id)] = (str(content), bool(getattr(token, "special", False)))
    return added


def _decoder_description(tokenizer: Any) -> str:
    """Return ``str(tokenizer.backend_tokenizer.decoder)``, or "" when there is none."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None) if backend is not None else None
    return str(decoder) if decoder is not None else ""


def detect_encoding(tokenizer: Any, pieces: list[str | None], added: set[int]) -> str:
    """Return BYTE_LEVEL or SENTENCEPIECE for the tokenizer's base (non-added) pieces.

    The fast tokenizer's decoder decides when present (``ByteLevel`` vs. ``▁``
    replacement / ``Metaspace`` / ``ByteFallback``). Otherwise the pieces decide:
    byte-level when some start with ``"Ġ"`` and all lie in the GPT-2 byte alphabet,
    SentencePiece when some contain ``"▁"``. Raises VocabularyError when neither fits
    (e.g. WordPiece). Cost: O(total piece length) without a decoder.
    """
    description = _decoder_description(tokenizer)
    if "ByteLevel" in description:
        return BYTE_LEVEL
    if any(marker in description for marker in ("Metaspace", "ByteFallback", SENTENCEPIECE_SPACE)):
        return SENTENCEPIECE
    base = [piece for token_id, piece in enumerate(pieces) if piece and token_id not in added]
    if any(piece.startswith("Ġ") for piece in base) and all(map(is_byte_level_piece, base)):
        return BYTE_LEVEL
    if any(SENTENCEPIECE_SPACE in piece for piece in base):
        return SENTENCEPIECE
    raise VocabularyError(
        f"{type(tokenizer).__name__}({tokenizer_name(tokenizer)!r}): tokenizer is neither "
        f"GPT-2 byte-level BPE nor SentencePiece (decoder: {description or 'none'})"
    )


def _declared_eos_ids(tokenizer: Any, size: int) -> set[int]:
    """Return ``eos_token_id`` (one id or a list). A model's
    ``generation_config.eos_token_id`` is not visible from the tokenizer and is not
    consulted; the text rules (:func:`~formline.vocab.special_texts.read_text_rules`) add
    the end-of-generation markers, as ``from_gguf`` does."""
    eos_ids: set[int] = set()
    declared = getattr(tokenizer, "eos_token_id", None)
    for value in declared if isinstance(declared, list | tuple) else [declared]:
        if value is None:
            continue
        token_id = operator.index(value)
        if not 0 <= token_id < size:
            raise VocabularyError(
                f"{type(tokenizer).__name__}({tokenizer_name(tokenizer)!r}): eos_token_id "
                f"{token_id} is outside the tokenizer's {size} ids"
            )
        eos_ids.add(token_id)
    return eos_ids


def _written_in_context(tokenizer: Any, token_ids: list[int]) -> dict[int, bytes]:
    """What the tokenizer writes for each non-special added token after an ordinary one
    (``decode([a, id])`` less ``decode([a])``): Hugging Face runs such tokens through its
    decoder, so Gemma's added space runs ``"▁▁"`` write two spaces and a byte-level
    ``"ĠĠfoo"`` writes ``"  foo"``, not their content's bytes. An id whose text does not
    follow the prefix's is left out (its content stands). Costs two decodes per id."""
    if not token_ids or not callable(getattr(tokenizer, "decode", None)):
        return {}
    options = {"skip_special_tokens": False, "clean_up_tokenization_spaces": False}
    try:
        prefix = list(tokenizer.encode("a", add_special_tokens=False))[-1:]
        before = tokenizer.decode(prefix, **options)
    except Exception:  # any tokenizer's failure: the contents stand
        return {}
    if not prefix:  # at a sequence's start the decoder strips a leading space
        return {}
    written: dict[int, bytes] = {}
    for token_id in token_ids:
        try:
            text = tokenizer.decode([*prefix, token_id], **options)
        except Exception:  # this token's content stands
            continue
        if isinstance(text, str) and text.startswith(before):
            written[token_id] = text[len(before) :].encode("utf-8", errors="surrogatepass")
    return written


def _piece_decoder(encoding: str, description: str) -> Callable[[str], bytes]:
    """Return the base-piece decoder; byte fallback unless a fast decoder lacks it."""
    if encoding == BYTE_LEVEL:
        return decode_byte_level_piece
    byte_fallback = not description or "ByteFallback" in description
    return lambda piece: decode_sentencepiece_piece(piece, byte_fallback=byte_fallback)


def huggingface_token_bytes(tokenizer: Any) -> tuple[list[bytes], set[int], set[int]]:
    """Decode a Hugging Face tokenizer into (token bytes by id, eos ids, special ids).

    * Added tokens (``added_tokens_decoder``): ``special=True`` ones are special ids
      (their content, UTF-8 encoded); the others write what the tokenizer's decoder makes
      of them after an ordinary token (``"▁▁"`` two spaces in Gemma).
    * Base pieces: byte-level → GPT-2 byte map; SentencePiece → ``▁`` is a space and
      ``<0xNN>`` the single byte 0xNN (the piece's bytes mid-sequence: the decoder's
      strip of the first token's leading space is not applied).
    * Ids without a piece (holes before the largest added id) and ``[PAD<id>]``
      filler pieces (even when registered as added tokens) → ``b""`` and special.
    * ``all_special_ids`` and the eos ids are special; then llama.cpp's text rules, as for
      ``from_gguf`` (:mod:`formline.vocab.special_texts`): end-of-generation and
      fill-in-the-middle markers are special, the end markers stop.

    Raises VocabularyError when the tokenizer lacks the required methods, is neither
    byte-level nor SentencePiece, or declares no eos token. Cost: one
    ``convert_ids_to_tokens`` call over all ids plus O(total piece length).
    """
    label = f"{type(tokenizer).__name__}({tokenizer_name(tokenizer)!r})"
    try:
        added = _added_tokens(tokenizer)
        size = max(len(tokenizer), max(added, default=-1) + 1)
        pieces = list(tokenizer.convert_ids_to_tokens(list(range(size))))
    except (AttributeError, TypeError) as error:
        raise VocabularyError(f"{label}: not a usable Hugging Face tokenizer: {error}") from error
    encoding = detect_encoding(tokenizer, pieces, set(added))
    decode_piece = _piece_decoder(encoding, _decoder_description(tokenizer))
    token_bytes: list[bytes] = []
    special_ids: set[int] = set()
    ordinary_added: list[int] = []
    for token_id, piece in enumerate(pieces):
        if piece is None or is_padding_piece(piece, token_id):
            token_bytes.append(b"")
            special_ids.add(token_id)
        elif token_id in added:
            content, special = added[token_id]
            token_bytes.append(content.encode("utf-8"))
            if special:
                special_ids.add(token_id)
            else:
                ordinary_added.append(token_id)
        else:
            token_bytes.append(decode_piece(piece))
    for token_id, written in _written_in_context(tokenizer, ordinary_added).items():
        token_bytes[token_id] = written
    declared_special = getattr(tokenizer, "all_special_ids", None) or []
    special_ids.update(token_id for token_id in declared_special if 0 <= token_id < size)
    texts = [
        added[token_id][0].encode("utf-8") if token_id in added else (piece or "").encode()
        for token_id, piece in enumerate(pieces)
    ]
    rules = read_text_rules(texts, _declared_eos_ids(tokenizer, size))
    if not rules.stopping:
        raise VocabularyError(f"{label}: tokenizer declares no eos token (eos_token_id is None)")
    special_ids = (special_ids | rules.special | rules.stopping) - rules.ordinary
    return token_bytes, rules.stopping, special_ids
