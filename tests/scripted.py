"""Engines for tests: scripted logits through the real decoding loop, and a scripted loop
for the layers above it.

:class:`ScriptedEngine` borrows a real engine's tokenizer and chat template and writes a
fixed answer through :func:`formline.pipeline.decoding.decode`: at each step the token
that continues the answer (the real tokenizer's split of what is left) has the highest
logit, and a stop token once the answer is written. The request's real matcher masks every
step, so a token the grammar refuses changes the output (and fails the test).

:class:`ScriptedDecoder` stands in for the model and its loop together: installed in place of
``formline.pipeline.generate.decode``, it returns scripted generations (text and finish
reason) and records the prompts and budgets it was given, for tests of what ``extract`` and
``formline eval`` do with an output.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from formline.pipeline import generate as generate_module
from formline.pipeline.decoding import Generation, Sampling
from formline.vocab import Vocabulary

PREFERRED_LOGIT = 100.0  # even sampled at temperature 1, every other token has p < 1e-38


class ScriptedEngine:
    """``answers`` written one per sequence (``reset``), through ``real``'s tokenizer."""

    name = "scripted"

    def __init__(self, real: Any, *answers: str, context_size: int = 2048):
        self.real = real
        self.vocabulary = real.vocabulary
        self.answers = list(answers)
        self.context_size = context_size
        self.answer = b""
        self.fed: list[int] = []
        self.prompt_length = 0

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        rendered: str = self.real.render_chat(messages)
        return rendered

    def tokenize_prompt(self, prompt: str) -> list[int]:
        tokens: list[int] = self.real.tokenize_prompt(prompt)
        self.prompt_length = len(tokens)
        return tokens

    def tokenize(self, text: bytes) -> list[int]:
        tokens: list[int] = self.real.tokenize(text)
        return tokens

    def reset(self) -> None:
        self.answer = self.answers.pop(0).encode() if self.answers else b""
        self.fed = []

    def forward(self, token_ids: list[int]) -> np.ndarray:
        self.fed.extend(token_ids)
        pieces = self.vocabulary.token_bytes
        written = b"".join(pieces[token] for token in self.fed[self.prompt_length :])
        logits = np.zeros(self.vocabulary.size, dtype=np.float32)
        rest = self.answer[len(written) :] if self.answer.startswith(written) else b""
        following = self.tokenize(rest)[:1] if rest else [min(self.vocabulary.eos_ids)]
        logits[following[0]] = PREFERRED_LOGIT
        return logits


def install_decoder(monkeypatch: Any, decoder: ScriptedDecoder) -> ScriptedDecoder:
    """Make ``formline.generate`` decode through ``decoder`` (undone after the test)."""
    monkeypatch.setattr(generate_module, "decode", decoder.decode)
    return decoder


class ScriptedDecoder:
    """Scripted ``(text, finish_reason)`` generations (a bare text means ``"stop"``), in
    order; ``prompts`` and ``max_tokens`` record what each call was given."""

    name = "scripted"

    def __init__(
        self,
        vocabulary: Vocabulary,
        *script: tuple[str, str] | str,
        forward_seconds: float = 0.0,
        mask_seconds: float = 0.0,
        completion_tokens: int | None = None,
    ):
        self.vocabulary = vocabulary
        self.script = [(item, "stop") if isinstance(item, str) else item for item in script]
        self.seconds = (forward_seconds, mask_seconds)
        self.completion_tokens = completion_tokens
        self.prompts: list[str] = []
        self.max_tokens: list[int] = []
        self.context_size = 2048

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        return "".join(f"<{m['role']}>\n{m['content']}\n" for m in messages) + "<assistant>\n"

    def decode(
        self, engine: Any, prompt: str, matcher: Any, sampling: Sampling, listeners: Any = ()
    ) -> Generation:
        assert engine is self, "the scripted loop ran for another engine"
        self.prompts.append(prompt)
        self.max_tokens.append(sampling.max_tokens)
        text, finish_reason = self.script.pop(0)
        forward_seconds, mask_seconds = self.seconds
        return Generation(
            [],
            text,
            finish_reason,
            len(prompt) // 4,
            self.completion_tokens or len(text) // 4 + 1,
            forward_seconds=forward_seconds,
            mask_seconds=mask_seconds,
        )
