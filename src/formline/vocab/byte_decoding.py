"""Turning tokenizer piece strings back into the raw bytes they stand for.

Two encodings of bytes as text are in common use:

* **GPT-2 byte-level BPE** (GPT-2, Llama 3, Qwen2, SmolLM2, ...): every byte 0..255 is
  mapped to one printable Unicode character (``bytes_to_unicode``), so a piece such
  as ``"Ġhello"`` stands for ``b" hello"``.
* **SentencePiece** (Llama 2, Phi-3, Mistral, ...): the space is written as ``"▁"``
  (U+2581) and, with byte fallback, a single byte is a piece of the form ``"<0xNN>"``.

Nothing here imports a tokenizer library; these are pure functions over strings.
"""

from __future__ import annotations

import functools
import re

SENTENCEPIECE_SPACE = "\u2581"
"""The SentencePiece meta symbol that stands for a space ("▁")."""

_BYTE_FALLBACK_PATTERN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@functools.cache
def bytes_to_unicode() -> dict[int, str]:
    """Return the GPT-2 map from each byte value (0..255) to its stand-in character.

    Printable Latin-1 bytes map to themselves; the other 68 bytes map to the
    characters U+0100 onwards, in byte order. Cost: built once, then cached.
    """
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    byte_values = printable[:]
    code_points = printable[:]
    extra = 0
    for byte_value in range(256):
        if byte_value not in printable:
            byte_values.append(byte_value)
            code_points.append(256 + extra)
            extra += 1
    return {
        byte_value: chr(code) for byte_value, code in zip(byte_values, code_points, strict=True)
    }


@functools.cache
def unicode_to_bytes() -> dict[str, int]:
    """Return the inverse of :func:`bytes_to_unicode` (character → byte value). Cached."""
    return {character: byte_value for byte_value, character in bytes_to_unicode().items()}


@functools.cache
def _byte_level_translation() -> dict[int, int]:
    """``str.translate`` table: stand-in character → Latin-1 character of its byte.

    Latin-1 characters that are *not* stand-ins (control characters, space, U+00A0,
    U+00AD) are sent to U+FFFF so that the Latin-1 encoding step rejects them.
    """
    table = {code: 0xFFFF for code in range(256)}
    table.update(
        {ord(character): byte_value for character, byte_value in unicode_to_bytes().items()}
    )
    return table


def byte_level_alphabet() -> frozenset[str]:
    """Return the 256 characters that may appear in a GPT-2 byte-level piece."""
    return frozenset(unicode_to_bytes())


def is_byte_level_piece(piece: str) -> bool:
    """Return True when every character of ``piece`` is a GPT-2 byte stand-in. Cost: O(len)."""
    mapping = unicode_to_bytes()
    return all(character in mapping for character in piece)


def decode_byte_level_piece(piece: str) -> bytes:
    """Return the bytes a GPT-2 byte-level piece stands for.

    A piece containing a character outside the 256-character alphabet cannot have
    been produced by the byte-level pre-tokenizer; like the Hugging Face ``ByteLevel``
    decoder, the whole piece is then taken as its own UTF-8 text. Never raises.
    Cost: O(len(piece)).
    """
    translated = piece.translate(_byte_level_translation())
    try:
        return translated.encode("latin-1")
    except UnicodeEncodeError:
        return piece.encode("utf-8")


def byte_fallback_value(piece: str) -> int | None:
    """Return NN when ``piece`` is exactly ``"<0xNN>"`` (a SentencePiece byte token), else None."""
    match = _BYTE_FALLBACK_PATTERN.fullmatch(piece)
    return int(match.group(1), 16) if match else None


def decode_sentencepiece_piece(piece: str, *, byte_fallback: bool = True) -> bytes:
    """Return the bytes a SentencePiece piece stands for, as it decodes mid-sequence.

    ``"▁"`` becomes a space; with ``byte_fallback`` a ``"<0xNN>"`` piece becomes the
    single byte 0xNN (possibly invalid UTF-8 on its own). The leading-space strip
    that decoders apply to the *first* token of a sequence is deliberately not
    applied. Never raises. Cost: O(len(piece)).
    """
    if byte_fallback:
        value = byte_fallback_value(piece)
        if value is not None:
            return bytes((value,))
    return piece.replace(SENTENCEPIECE_SPACE, " ").encode("utf-8")
