"""llama.cpp's rules that read a token's *text* to make it a control or stop token.

llama.cpp (``llama-vocab.cpp``, the version vendored in ``llama-cpp-python==0.3.36``) does
not trust a GGUF file's token types alone: a token whose text is an end-of-generation or a
fill-in-the-middle marker becomes a control token whatever its type, and the end markers
(and FIM's pad, repo and file-separator markers) stop generation. formline read the types
only, so phi-3's ``</s>`` (id 2) and Qwen2's were text to the mask: after ``<p>`` the regex
``<p>[a-z/<>]*</p>`` allowed them, and llama.cpp then stopped on them mid-grammar (it writes
no text for a control token). Two workarounds of llama.cpp undo the rule: with gpt-oss's
``<|return|>`` and ``<|call|>`` (or solar-open's ``<|calls|>``/``<|call|>`` and
``<|flush|>``), ``<|end|>`` is an ordinary token again, and with Gemma 4's
``<|tool_response>`` (or PLaMo's ``<|plamo:eos|>``), ``</s>`` is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

# The texts whose tokens end a generation (llama.cpp's end-of-generation list).
END_OF_GENERATION_TEXTS = frozenset(
    {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
        "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>",
        "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>",
        "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[",
    }
)  # fmt: skip
# Fill-in-the-middle markers: control tokens; the pad, repo and file-separator ones stop.
FILL_IN_THE_MIDDLE_TEXTS = frozenset(
    {
        "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
        "<|code_prefix|>", "<|prefix|>", "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
        "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>", "<|fim_middle|>",
        "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>",
        "<|middle|>",
    }
)  # fmt: skip
# The stopping FIM markers by kind (pad, repo, file separator): a kind the file names by
# id (tokenizer.ggml.fim_pad_token_id, ...) is not looked for by text.
FILL_IN_THE_MIDDLE_STOP_TEXTS = {
    "pad": frozenset({"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"}),
    "repo": frozenset({"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"}),
    "separator": frozenset({"<|file_sep|>"}),
}
# (the markers that make a token ordinary again, the token they make ordinary); "<|call|>"
# and "<|calls|>" both count as the call marker, as in llama.cpp.
ORDINARY_AGAIN = (
    ({"<|return|>", "<|call|>"}, "<|end|>"),
    ({"<|return|>", "<|calls|>"}, "<|end|>"),
    ({"<|call|>", "<|flush|>"}, "<|end|>"),
    ({"<|calls|>", "<|flush|>"}, "<|end|>"),
    ({"<|tool_response>"}, "</s>"),
    ({"<|plamo:eos|>"}, "</s>"),
)


class TextRules(NamedTuple):
    """What the texts make of the ids: control (special), stopping, and ordinary again."""

    special: set[int]
    stopping: set[int]
    ordinary: set[int]


_STOPPING = frozenset(text.encode() for text in END_OF_GENERATION_TEXTS)
_CONTROL = frozenset(text.encode() for text in FILL_IN_THE_MIDDLE_TEXTS)
_FIM_STOPPING = {
    kind: frozenset(text.encode() for text in texts)
    for kind, texts in FILL_IN_THE_MIDDLE_STOP_TEXTS.items()
}
_ANY = _STOPPING | _CONTROL | frozenset().union(*_FIM_STOPPING.values())


def read_text_rules(
    texts: Sequence[bytes], stopping: set[int], named_kinds: frozenset[str] = frozenset()
) -> TextRules:
    """llama.cpp's text rules over ``texts`` (a GGUF file's token texts, UTF-8, by id),
    given the ids already ``stopping`` (the file's own eos, eot, eom and FIM ids) and the
    FIM kinds the file names by id (``named_kinds``, not looked for by text): the ids they
    make special, the ids that stop (``stopping`` included) and the ids made ordinary again
    (neither special nor stopping, their text written). A text held by several ids counts
    for the last, as llama.cpp's map from text to id keeps it. Costs one pass over the
    texts (set lookups of bytes: nothing is decoded)."""
    last: dict[bytes, int] = {}
    for token_id, text in enumerate(texts):
        if text in _ANY:
            last[text] = token_id
    special: set[int] = set()
    stops = set(stopping)
    for text, token_id in last.items():
        if text in _STOPPING:
            special.add(token_id)
            stops.add(token_id)
        elif text in _CONTROL:
            special.add(token_id)
        else:
            kind = next(kind for kind, kind_texts in _FIM_STOPPING.items() if text in kind_texts)
            if kind not in named_kinds:
                special.add(token_id)
                stops.add(token_id)
    stop_texts = {texts[token_id]: token_id for token_id in stops if 0 <= token_id < len(texts)}
    ordinary: set[int] = set()
    for markers, token in ORDINARY_AGAIN:
        needed = {marker.encode() for marker in markers}
        if token.encode() in stop_texts and needed <= stop_texts.keys():
            ordinary.add(stop_texts[token.encode()])
    return TextRules(special - ordinary, stops - ordinary, ordinary)
