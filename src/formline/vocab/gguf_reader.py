"""Reading the tokenizer of a GGUF file and turning it into token bytes.

The ``gguf`` package supplies the format constants (magic, value types, key names,
token types). Its ``GGUFReader`` is not used for parsing: it builds one numpy view
per array element of every key (tokens *and* merges) and takes about 5 s on a
151k-token vocabulary. Instead the key/value header is walked here directly with
``struct`` over a memory map, decoding only the keys we need and skipping the rest;
tensor data (the bulk of a model file) is never touched.

The GGUF layout (v2/v3): magic ``GGUF``, ``uint32`` version, ``uint64`` tensor count,
``uint64`` key/value count, then key/value pairs: key (``uint64`` length + UTF-8
bytes), ``uint32`` value type, value. Strings are ``uint64`` length + bytes; arrays are
``uint32`` element type, ``uint64`` count, elements. Big-endian files are detected
from the version field, as ``gguf`` itself does.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from formline.vocab.byte_decoding import SENTENCEPIECE_SPACE, decode_byte_level_piece
from formline.vocab.special_texts import read_text_rules
from formline.vocab.vocabulary import VocabularyError, is_padding_piece

_WANTED_KEYS = (
    "general.architecture",
    "tokenizer.ggml.model",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.eom_token_id",
    *(f"tokenizer.ggml.fim_{kind}_token_id" for kind in ("pad", "rep", "sep")),
)
# The FIM stop kinds of special_texts by their GGUF key's word.
_FIM_KINDS = {"pad": "pad", "rep": "repo", "sep": "separator"}

# Scalar value types (GGUFValueType numbering) → struct format character.
_SCALAR_FORMATS = {
    0: "B",  # UINT8
    1: "b",  # INT8
    2: "H",  # UINT16
    3: "h",  # INT16
    4: "I",  # UINT32
    5: "i",  # INT32
    6: "f",  # FLOAT32
    7: "?",  # BOOL
    10: "Q",  # UINT64
    11: "q",  # INT64
    12: "d",  # FLOAT64
}
_STRING_TYPE = 8
_ARRAY_TYPE = 9

# Token types (gguf.TokenType numbering).
TOKEN_NORMAL = 1
TOKEN_UNKNOWN = 2
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4
TOKEN_UNUSED = 5
TOKEN_BYTE = 6
# Token types whose ids may appear in grammar text; every other type (UNKNOWN,
# CONTROL, UNUSED, and any type number this code does not know) is special.
_TEXT_TOKEN_TYPES = frozenset({TOKEN_NORMAL, TOKEN_USER_DEFINED, TOKEN_BYTE})
MAX_ARRAY_DEPTH = 4  # arrays of arrays in a header: none in real files
_BYTE_TOKEN_PATTERN = re.compile(rb"<0x([0-9A-Fa-f]{2})>")
_SENTENCEPIECE_SPACE = SENTENCEPIECE_SPACE.encode()


@dataclass(frozen=True)
class GGUFTokenizer:
    """The tokenizer keys of one GGUF file, undecoded (token texts as raw bytes)."""

    path: str
    model: str
    tokens: list[bytes]
    token_types: list[int]
    eos_token_id: int | None
    eot_token_id: int | None
    eom_token_id: int | None
    architecture: str | None
    # FIM stop kind (special_texts' "pad", "repo", "separator") -> the id the file names
    fill_in_the_middle_ids: dict[str, int] = field(default_factory=dict)
    context_length: int | None = None  # {architecture}.context_length: the trained context


class _HeaderWalker:
    """Sequential reader of GGUF header values over a buffer; raises VocabularyError."""

    def __init__(self, buffer: Any, path: str) -> None:
        self.buffer = buffer
        self.path = path
        self.offset = 0
        self.order = "<"

    def fail(self, what: str) -> VocabularyError:
        return VocabularyError(
            f"{self.path}: corrupt GGUF file: {what} (byte offset {self.offset})"
        )

    def scalar(self, format_character: str) -> Any:
        layout = struct.Struct(self.order + format_character)
        if self.offset + layout.size > len(self.buffer):
            raise self.fail("unexpected end of file")
        (value,) = layout.unpack_from(self.buffer, self.offset)
        self.offset += layout.size
        return value

    def raw_string(self) -> bytes:
        length = self.scalar("Q")
        end = self.offset + length
        if end > len(self.buffer):
            raise self.fail(f"string of {length} bytes runs past the end of the file")
        data = self.buffer[self.offset : end]
        self.offset = end
        return bytes(data)

    def string_array(self, count: int, keep: bool) -> list[bytes]:
        """Read (or, with ``keep`` False, skip) ``count`` strings. Cost: O(count)."""
        buffer, offset, size = self.buffer, self.offset, len(self.buffer)
        unpack_length = struct.Struct(self.order + "Q").unpack_from
        strings: list[bytes] = []
        append = strings.append
        for _ in range(count):
            if offset + 8 > size:
                self.offset = offset
                raise self.fail("string array runs past the end of the file")
            (length,) = unpack_length(buffer, offset)
            offset += 8
            if keep:
                append(buffer[offset : offset + length])
            offset += length
        if offset > size:
            raise self.fail("string array runs past the end of the file")
        self.offset = offset
        return strings

    def value(self, value_type: int, keep: bool, depth: int = 0) -> Any:
        """Read one value of ``value_type``; arrays of strings and of arrays come back as
        lists, arrays of scalars as numpy arrays (one copy of the file's bytes: a list of
        them took 17 times the file's size, 1.1 GB for a 64 MB file whose corrupt count
        made one array of it). Arrays nest at most :data:`MAX_ARRAY_DEPTH` deep (real files
        never nest them: 5,000 levels in 60 kB raised RecursionError)."""
        if value_type == _STRING_TYPE:
            return self.raw_string()
        if value_type in _SCALAR_FORMATS:
            return self.scalar(_SCALAR_FORMATS[value_type])
        if value_type != _ARRAY_TYPE:
            raise self.fail(f"unknown value type {value_type}")
        element_type = self.scalar("I")
        count = self.scalar("Q")
        if count > len(self.buffer) - self.offset:
            raise self.fail(f"array of {count} elements is larger than the file")
        if element_type == _STRING_TYPE:
            return self.string_array(count, keep)
        if element_type in _SCALAR_FORMATS:
            element = np.dtype(self.order + _SCALAR_FORMATS[element_type])
            if self.offset + count * element.itemsize > len(self.buffer):
                raise self.fail("array runs past the end of the file")
            start, self.offset = self.offset, self.offset + count * element.itemsize
            return np.frombuffer(self.buffer, element, count, start).copy() if keep else []
        if depth >= MAX_ARRAY_DEPTH:
            raise self.fail(f"arrays nested more than {MAX_ARRAY_DEPTH} deep")
        if not keep:  # walked, not kept: no list of 2 million empty lists
            for _ in range(count):
                self.value(element_type, keep, depth + 1)
            return []
        return [self.value(element_type, keep, depth + 1) for _ in range(count)]


def _read_header_keys(buffer: Any, path: str) -> dict[str, Any]:
    """Return the wanted keys of a GGUF header (raises VocabularyError on a bad header)."""
    import gguf  # the format constants; imported here to keep `formline.vocab` light

    walker = _HeaderWalker(buffer, path)
    if len(buffer) < 24 or walker.scalar("I") != gguf.GGUF_MAGIC:
        raise VocabularyError(f"{path}: not a GGUF file (missing the 'GGUF' magic)")
    version = walker.scalar("I")
    if version & 0xFFFF == 0:  # written on a big-endian machine
        walker.order = ">"
        version = struct.unpack(">I", struct.pack("<I", version))[0]
    if version not in (2, 3):
        raise VocabularyError(f"{path}: unsupported GGUF version {version} (supported: 2, 3)")
    walker.scalar("Q")  # tensor count
    key_count = walker.scalar("Q")
    found: dict[str, Any] = {}
    seen: set[str] = set()
    for _ in range(key_count):
        key = walker.raw_string().decode("utf-8", errors="replace")
        if key in seen:  # a second tokenizer.ggml.tokens replaced the first
            raise VocabularyError(f"{path}: GGUF key {key!r} appears twice in the header")
        seen.add(key)
        value_type = walker.scalar("I")
        wanted = key in _WANTED_KEYS or key.endswith(".context_length")
        value = walker.value(value_type, keep=wanted)
        if wanted:
            found[key] = value
        if len(found) > len(_WANTED_KEYS):  # each wanted key and a context length
            break
    return found


def read_gguf_tokenizer(path: str | os.PathLike[str]) -> GGUFTokenizer:
    """Read the tokenizer keys of the GGUF file at ``path``.

    Raises VocabularyError (naming the path) when the file is missing, not GGUF,
    corrupt, or lacks ``tokenizer.ggml.model`` / ``tokenizer.ggml.tokens``.
    Cost: memory-maps the file and walks only the key/value header, O(header size);
    about 0.03 s for a 151k-token vocabulary.
    """
    path_text = os.fspath(path)
    try:
        with (
            open(path_text, "rb") as handle,
            mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buffer,
        ):
            keys = _read_header_keys(buffer, path_text)
    except VocabularyError:
        raise
    except (OSError, ValueError) as error:
        raise VocabularyError(f"{path_text}: cannot read GGUF file: {error}") from error
    return _tokenizer_from_keys(keys, path_text)


def _token_types(given: Any, count: int, path: str) -> list[int]:
    """The token types of ``count`` tokens: all NORMAL when the file has no such key (as in
    llama.cpp); an empty or scalar value is no such key, but an error (raises
    VocabularyError)."""
    if given is None:
        return [TOKEN_NORMAL] * count
    if not isinstance(given, np.ndarray) or given.dtype.kind not in "iu":
        raise VocabularyError(f"{path}: tokenizer.ggml.token_type is not an array of integers")
    if len(given) != count:  # an empty array made every control token text
        raise VocabularyError(
            f"{path}: tokenizer.ggml.token_type has {len(given)} entries "
            f"but tokenizer.ggml.tokens has {count}"
        )
    return given.tolist()


def _tokenizer_from_keys(keys: dict[str, Any], path: str) -> GGUFTokenizer:
    """Check the types of the header keys and package them (raises VocabularyError)."""
    for required in ("tokenizer.ggml.model", "tokenizer.ggml.tokens"):
        if required not in keys:
            raise VocabularyError(f"{path}: GGUF file has no {required} key (no tokenizer)")
    tokens = keys["tokenizer.ggml.tokens"]
    if not isinstance(tokens, list) or not all(type(token) is bytes for token in tokens):
        raise VocabularyError(f"{path}: tokenizer.ggml.tokens is not an array of strings")
    token_types = _token_types(keys.get("tokenizer.ggml.token_type"), len(tokens), path)

    def optional_id(key: str) -> int | None:
        value = keys.get(key)
        if value is not None and not isinstance(value, int):
            raise VocabularyError(f"{path}: {key} is not an integer ({value!r})")
        return value

    def optional_text(key: str) -> str | None:
        value = keys.get(key)
        return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else None

    return GGUFTokenizer(
        path=path,
        model=optional_text("tokenizer.ggml.model") or "",
        tokens=tokens,
        token_types=token_types,
        eos_token_id=optional_id("tokenizer.ggml.eos_token_id"),
        eot_token_id=optional_id("tokenizer.ggml.eot_token_id"),
        eom_token_id=optional_id("tokenizer.ggml.eom_token_id"),
        architecture=optional_text("general.architecture"),
        fill_in_the_middle_ids={
            kind: value
            for word, kind in _FIM_KINDS.items()
            if (value := optional_id(f"tokenizer.ggml.fim_{word}_token_id")) is not None
        },
        context_length=optional_id(f"{optional_text('general.architecture')}.context_length"),
    )


_TokenDecoder = Callable[[bytes, int], bytes]


def _normal_token_decoder(tokenizer: GGUFTokenizer) -> _TokenDecoder:
    """Return the function decoding a NORMAL token's raw text into its bytes."""
    if tokenizer.model == "gpt2":

        def decode_byte_level(text: bytes, token_id: int) -> bytes:
            try:
                return decode_byte_level_piece(text.decode("utf-8"))
            except UnicodeDecodeError as error:
                raise VocabularyError(
                    f"{tokenizer.path}: token {token_id} is not valid UTF-8 text ({text!r})"
                ) from error

        return decode_byte_level
    if tokenizer.model == "llama":
        return lambda text, _token_id: text.replace(_SENTENCEPIECE_SPACE, b" ")
    raise VocabularyError(
        f"{tokenizer.path}: unsupported tokenizer model {tokenizer.model!r} "
        "(supported: 'gpt2' byte-level BPE, 'llama' SentencePiece)"
    )


def _decode_token(
    text: bytes,
    token_type: int,
    token_id: int,
    decode_normal: _TokenDecoder,
    tokenizer: GGUFTokenizer,
) -> bytes:
    """Return the bytes of one GGUF token given its type (see gguf_token_bytes)."""
    if token_type == TOKEN_NORMAL:
        return decode_normal(text, token_id)
    if token_type == TOKEN_BYTE:
        match = _BYTE_TOKEN_PATTERN.fullmatch(text)
        if match is None:
            raise VocabularyError(
                f"{tokenizer.path}: token {token_id} has type BYTE but text {text!r} "
                "is not of the form <0xNN>"
            )
        return bytes((int(match.group(1), 16),))
    # USER_DEFINED (added) tokens are stored as plain text; CONTROL/UNKNOWN/UNUSED
    # tokens are special and keep their text only as a label.
    return text


def _declared_eos_ids(tokenizer: GGUFTokenizer) -> set[int]:
    """Return the eos/eot/eom and FIM pad/repo/separator ids the file declares (llama.cpp
    stops on each; raises VocabularyError if one is out of range)."""
    declared: set[int] = set()
    fill_in_the_middle = [
        (f"tokenizer.ggml.fim_{word}_token_id", tokenizer.fill_in_the_middle_ids.get(kind))
        for word, kind in _FIM_KINDS.items()
    ]
    for key, value in (
        ("tokenizer.ggml.eos_token_id", tokenizer.eos_token_id),
        ("tokenizer.ggml.eot_token_id", tokenizer.eot_token_id),
        ("tokenizer.ggml.eom_token_id", tokenizer.eom_token_id),
        *fill_in_the_middle,
    ):
        if value is None:
            continue
        if not 0 <= value < len(tokenizer.tokens):
            raise VocabularyError(
                f"{tokenizer.path}: {key} = {value} is outside the "
                f"{len(tokenizer.tokens)}-token vocabulary"
            )
        declared.add(value)
    return declared


def gguf_token_bytes(tokenizer: GGUFTokenizer) -> tuple[list[bytes], set[int], set[int]]:
    """Decode a GGUF tokenizer into (token bytes by id, eos ids, special ids).

    * NORMAL: ``gpt2`` → GPT-2 byte-level map; ``llama`` → UTF-8 with ``▁`` → space.
    * BYTE: ``<0xNN>`` → the single byte 0xNN.
    * USER_DEFINED: the text as-is (added tokens are stored as plain text).
    * CONTROL, UNKNOWN, UNUSED (and unknown type numbers): the text as-is, and the
      id is special.
    * Padding pieces ``[PAD<id>]`` (written by llama.cpp's converter to fill the
      vocabulary up to the model's logits size, typed USER_DEFINED or UNKNOWN
      depending on the converter's version) → ``b""`` and special.

    Eos ids: ``tokenizer.ggml.eos_token_id``, ``eot_token_id`` and ``eom_token_id``.
    Then llama.cpp's text rules (:mod:`formline.vocab.special_texts`): a token whose text
    is an end-of-generation or fill-in-the-middle marker is special whatever its type, the
    end markers stop, and the two workarounds that make ``<|end|>`` or ``</s>`` ordinary.
    Raises VocabularyError naming the path and token id on an unsupported model
    type, a malformed BYTE token, a non-UTF-8 byte-level token or an eos id out
    of range. Cost: O(total token text), about 0.07 s for 151k tokens.
    """
    decode_normal = _normal_token_decoder(tokenizer)
    token_bytes: list[bytes] = []
    special_ids: set[int] = set()
    eos_ids: set[int] = set()
    for token_id, (text, token_type) in enumerate(
        zip(tokenizer.tokens, tokenizer.token_types, strict=True)
    ):
        if token_type != TOKEN_NORMAL and is_padding_piece(text, token_id):
            token_bytes.append(b"")
            special_ids.add(token_id)
            continue
        token_bytes.append(_decode_token(text, token_type, token_id, decode_normal, tokenizer))
        if token_type not in _TEXT_TOKEN_TYPES:
            special_ids.add(token_id)
    eos_ids.update(_declared_eos_ids(tokenizer))
    named = frozenset(tokenizer.fill_in_the_middle_ids)
    rules = read_text_rules(tokenizer.tokens, eos_ids, named)
    for token_id in rules.ordinary:  # llama.cpp writes its text, as a user-defined token
        token_bytes[token_id] = tokenizer.tokens[token_id]
    return token_bytes, rules.stopping, (special_ids | rules.special) - rules.ordinary
