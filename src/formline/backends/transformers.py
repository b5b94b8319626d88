"""The Hugging Face transformers backend, and a logits processor for ``model.generate``.

:class:`TransformersBackend` is a ``transformers`` causal LM (a GGUF file, dequantized on
load, or a model directory) as a formline engine: a forward pass over new tokens with the
KV cache, the last logits as numpy; formline's one decoding loop
(:func:`formline.pipeline.decoding.decode`) masks, samples and jump-forwards.
:class:`FormlineLogitsProcessor` plugs a compiled grammar into the user's own
``model.generate(...)`` (greedy, sampling, batches with left padding).

This is the only formline module that imports torch and transformers.
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from formline.backends.base import BackendError, ChatTemplateError
from formline.backends.chat import render_guarded, special_text_pattern, tokenize_prompt_pieces
from formline.mask.batch import default_batch_matcher
from formline.mask.bitmask import allocate_token_bitmask, apply_token_bitmask_inplace
from formline.mask.compiled import CompiledGrammar
from formline.mask.matcher import GrammarMatcher
from formline.vocab import Vocabulary
from formline.vocab.vocabulary import VocabularyError

try:
    import torch
    from jinja2 import TemplateError  # transformers renders chat templates with it
    from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessor
except ImportError as _error:  # pragma: no cover - depends on the environment
    raise BackendError(
        "the transformers backend needs torch and transformers: "
        "pip install 'formline[hf]' torch accelerate"
    ) from _error

DEFAULT_CONTEXT = 2048  # positions assumed when the config does not say


class TransformersBackend:
    """A ``transformers`` causal LM behind formline's :class:`~formline.backends.Backend`.

    Args:
        model_path: a ``.gguf`` file (needs ``accelerate``; dequantized to float32 unless
            ``dtype`` says otherwise) or a Hugging Face model directory. Local paths only.
        device: a torch device (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...).
        dtype: ``None`` (the checkpoint's), or a torch dtype name (``"bfloat16"``, ...).
        threads: torch's CPU thread count (``torch.set_num_threads``, process-wide); ``None``
            leaves it alone. SmolLM2-135M runs 41 ms per token on 1 thread and on 2 alike,
            but 2 threads took 260 ms per token while another process held one of 2 cores.

    Raises:
        BackendError: a missing path or package, a model that fails to load, or a tokenizer
            with more ids than the model has logits.
    Costs the load: 15-19 s for SmolLM2-135M Q4_1 on 2 CPU cores (5 s of it the GGUF
    tokenizer conversion), and the model's weights in memory (0.5 GiB in float32).
    """

    name = "transformers"

    def __init__(
        self,
        model_path: Path,
        device: str = "cpu",
        dtype: str | None = None,
        threads: int | None = None,
    ):
        path = Path(model_path)
        if not path.exists():
            raise BackendError(f"model not found: {path}")
        self.model_path = path
        if threads is not None:
            torch.set_num_threads(threads)
        self.device = torch.device(device)
        self.tokenizer, self.model = _load(path, dtype)
        self.model.to(self.device)
        self.model.eval()
        self.logits_size = logits_size(self.model)
        try:
            self.vocabulary = Vocabulary.from_huggingface(self.tokenizer, self.logits_size)
        except VocabularyError as error:
            raise BackendError(f"{path}: tokenizer and model disagree: {error}") from error
        self._special_texts = special_text_pattern(self.vocabulary)
        parameters = inspect.signature(self.model.forward).parameters
        # logits_to_keep=1 skips the LM head on all but the last position: the head is
        # 49,152 x 576 = 28M multiply-adds per position for SmolLM2 (a fifth of the model).
        self._keep_last = {"logits_to_keep": 1} if "logits_to_keep" in parameters else {}
        # transformers 5.x names the KV cache ``cache`` (``past_key_values`` is deprecated,
        # removed in 5.40); 4.x only knows ``past_key_values``.
        self._cache_name = "cache" if "cache" in parameters else "past_key_values"
        self._cache: Any = None

    @property
    def chat_template(self) -> str | None:
        """The tokenizer's chat template text (``None``: it has none)."""
        template = getattr(self.tokenizer, "chat_template", None)
        return template if isinstance(template, str) else None

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """The model's chat template applied to ``messages``, assistant turn opened; a
        message whose text holds a special token's text keeps it as text
        (:mod:`formline.backends.chat`).

        Raises:
            BackendError: the tokenizer has no chat template.
            ChatTemplateError: the template refused the messages, or changes a message text
                that holds a special token's text.
        """
        return render_guarded(self._render, messages, self._special_texts)

    def _render(self, messages: list[dict[str, str]]) -> str:
        """The template applied to ``messages`` (see :meth:`render_chat`)."""
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
        except TemplateError as error:
            if type(error) is not TemplateError:  # a syntax error, an undefined name: its own
                raise BackendError(f"the chat template failed to render: {error}") from error
            # transformers' raise_exception raises exactly TemplateError: the messages' fault
            raise ChatTemplateError(f"the chat template refused the messages: {error}") from error
        except ValueError as error:  # transformers: "no chat template"
            raise BackendError(f"{self.model_path}: {error}") from error
        return str(text)

    @property
    def context_size(self) -> int:
        """The model's positions (``max_position_embeddings``; 8,192 for SmolLM2), else
        2,048."""
        config = self.model.config.get_text_config()
        return int(getattr(config, "max_position_embeddings", None) or DEFAULT_CONTEXT)

    def tokenize_prompt(self, prompt: str) -> list[int]:
        """Prompt token ids: special-token texts parsed (not in a
        :class:`~formline.backends.chat.RenderedPrompt`'s text spans); the tokenizer's
        special tokens (BOS) are added unless the text already starts with them (a rendered
        chat template carries its own)."""
        bos = getattr(self.tokenizer, "bos_token", None)
        add_special = not (bos and prompt.startswith(bos))
        return tokenize_prompt_pieces(
            prompt,
            lambda text, first, special: self.tokenizer(
                text, add_special_tokens=add_special and first, split_special_tokens=not special
            )["input_ids"],
        )

    def tokenize(self, text: bytes) -> list[int]:
        """``text``'s tokens alone (no special tokens added)."""
        # Special tokens' texts stay text (as llama.cpp tokenizes them here): read as the
        # special ids, a forced "a<|endoftext|>b" could not be fed and the answer ran out.
        ids: list[int] = self.tokenizer.encode(
            text.decode("utf-8", errors="replace"),
            add_special_tokens=False,
            split_special_tokens=True,
        )
        return ids

    def reset(self) -> None:
        """Start a new sequence: drop the KV cache."""
        self._cache = None

    def forward(self, token_ids: list[int]) -> np.ndarray:
        """One forward pass over ``token_ids`` after the cached sequence; the last logits
        as a float32 numpy array (on the CPU). Costs one model call (41 ms for SmolLM2-135M
        in float32 on a CPU core)."""
        input_ids = torch.tensor([token_ids], dtype=torch.long, device=self.device)
        options = {self._cache_name: self._cache, "use_cache": True, **self._keep_last}
        with torch.no_grad():
            out = self.model(input_ids=input_ids, **options)
        self._cache = getattr(out, self._cache_name)
        logits: np.ndarray = out.logits[0, -1].float().cpu().numpy()
        return logits


def logits_size(model: Any) -> int:
    """The number of logits the model produces: its output embedding's rows (else
    ``config.vocab_size``)."""
    head = model.get_output_embeddings()
    weight = getattr(head, "weight", None)
    if weight is not None:
        return int(weight.shape[0])
    return int(model.config.get_text_config().vocab_size)


def _load(path: Path, dtype: str | None) -> tuple[Any, Any]:
    """(tokenizer, model) from a GGUF file or a model directory, offline."""
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise BackendError(f"{path}: expected a .gguf file or a model directory")
        if importlib.util.find_spec("accelerate") is None:
            raise BackendError("transformers needs accelerate to load a GGUF file")
        directory, options = str(path.parent), {"gguf_file": path.name}
    else:
        directory, options = str(path), {}
    model_options: dict[str, Any] = dict(options)
    if dtype is not None:
        torch_dtype = getattr(torch, dtype, None)
        if not isinstance(torch_dtype, torch.dtype):
            raise BackendError(f"unknown dtype {dtype!r}: use e.g. 'float32' or 'bfloat16'")
        model_options["dtype"] = torch_dtype
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True, **options)
        model = AutoModelForCausalLM.from_pretrained(
            directory, local_files_only=True, **model_options
        )
    except Exception as error:  # a truncated GGUF raised struct.error: a traceback, exit 1
        raise BackendError(f"{path}: transformers cannot load the model: {error}") from error
    return tokenizer, model


# The most draft tokens a refused one may stay behind (transformers' assistant drafts 20 by
# default, prompt lookup 10); also how far back a call that did not grow by one compares.
LOOKBACK_TOKENS = 64


class FormlineLogitsProcessor(LogitsProcessor):
    """A grammar constraint for ``model.generate(..., logits_processor=[processor])``.

    Keeps one :class:`GrammarMatcher` per batch row, created at the first call. Each call
    follows the rows' tokens (``input_ids[row, prompt_length:]``) and masks every row's
    scores with one batched ``(batch, words)`` bitmask; a row whose matcher has accepted a
    stop token gets only eos allowed. Works with greedy and sampling (``generate`` applies
    temperature and top-p after this processor), with left-padded batches, and with
    assisted and prompt-lookup decoding: a sequence that loses tokens (draft tokens the
    model rejected) is rolled back to what it kept, and a draft token the grammar refuses
    is left unaccepted (verification rejects it: its position's scores were masked). Beam
    search is not supported (beams reorder rows). Use a fresh processor per ``generate``.

    Args:
        grammar: a :class:`CompiledGrammar`, or an object with ``.compiled_grammar`` (a
            ``CompiledSchema``).
        prompt_length: the padded prompt length (``input_ids.shape[1]``), one per row, or
            ``None`` for the length of ``input_ids`` at the first call.
        eos_token_id: the ids ``generate`` stops on (``model.generation_config
            .eos_token_id``): where the grammar ends only they are allowed. Left out, every
            stop token of the vocabulary is (SmolLM2 has three, and ``generate``, stopping on
            one, wrote another to ``max_new_tokens``).

    Raises (at a call):
        ValueError: ``scores`` are narrower than the grammar's vocabulary.
        RuntimeError: a token the grammar refuses stayed in a row for
            :data:`LOOKBACK_TOKENS` more tokens (no draft is that long: another processor
            or beam search changed the tokens), or the batch size changed between calls.
        ValueError (at construction): none of ``eos_token_id`` is a stop token.
    Costs per call: one mask fill per row (a cached lookup) and one vectorised apply; a
    call whose sequence did not grow by one token compares the last LOOKBACK_TOKENS.
    """

    def __init__(
        self,
        grammar: Any,
        prompt_length: int | Sequence[int] | None = None,
        eos_token_id: int | Sequence[int] | None = None,
    ):
        compiled = getattr(grammar, "compiled_grammar", grammar)
        if not isinstance(compiled, CompiledGrammar):
            raise TypeError(
                f"expected a CompiledGrammar or an object with .compiled_grammar, "
                f"got {type(grammar).__name__}"
            )
        self.compiled = compiled
        self.prompt_length = prompt_length
        self.matchers: list[GrammarMatcher] = []
        self._starts: list[int] = []  # per row: the column its output starts at
        self._tokens: list[list[int]] = []  # per row: its output tokens as last seen
        self._fed: list[int] = []  # per row: how many of them its matcher accepted
        self._length = 0  # input_ids' width at the last call
        self._bitmask: np.ndarray | None = None
        self._keep = _end_words(compiled.vocabulary, eos_token_id)

    def _start(self, input_ids: Any) -> None:
        batch = int(input_ids.shape[0])
        length = self.prompt_length
        if length is None:
            length = int(input_ids.shape[1])
        starts = [int(length)] * batch if isinstance(length, int) else [int(n) for n in length]
        if len(starts) != batch:
            raise ValueError(f"{len(starts)} prompt lengths for a batch of {batch}")
        self.matchers = [GrammarMatcher(self.compiled) for _ in range(batch)]
        self._starts = starts
        self._tokens = [[] for _ in range(batch)]
        self._fed = [0] * batch
        self._length = min(starts)
        self._bitmask = allocate_token_bitmask(batch, self.compiled.vocabulary_size)

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        """Follow the rows' tokens and mask ``scores`` (``(batch, vocab)``) in place."""
        if not self.matchers:
            self._start(input_ids)
        if int(input_ids.shape[0]) != len(self.matchers):
            raise RuntimeError(
                f"batch size changed from {len(self.matchers)} to {input_ids.shape[0]} "
                "(beam search is not supported; use a fresh processor per generate call)"
            )
        bitmask = self._bitmask
        assert bitmask is not None
        if int(scores.shape[-1]) < self.compiled.vocabulary_size:  # masked in part, silently
            raise ValueError(
                f"scores have {scores.shape[-1]} columns; the grammar's vocabulary has "
                f"{self.compiled.vocabulary_size} tokens"
            )
        width = int(input_ids.shape[1])
        # Grown by one token: nothing seen can have changed, copy only the new column.
        # Else (a draft's tokens rejected) compare the last LOOKBACK_TOKENS too.
        lookback = 0 if width == self._length + 1 else LOOKBACK_TOKENS
        first = min(
            start + max(0, len(tokens) - lookback)
            for start, tokens in zip(self._starts, self._tokens, strict=True)
        )
        first = min(first, width)
        rows = input_ids[:, first:].tolist()
        for row, ids in enumerate(rows):
            self._follow(row, ids, first)
        self._length = width
        default_batch_matcher().batch_fill_next_token_bitmask(self.matchers, bitmask)
        if self._keep is not None:
            bitmask &= self._keep
        apply_token_bitmask_inplace(scores, bitmask)
        return scores

    def _follow(self, row: int, ids: list[int], first: int) -> None:
        """Bring row ``row``'s matcher to its tokens, ``ids`` being its columns from
        ``first``: the tokens it lost taken back, the new ones accepted up to a refused one
        (a draft's: kept unaccepted, and its later tokens with it, until they are lost).

        Raises:
            RuntimeError: a refused token stayed for LOOKBACK_TOKENS more tokens.
        """
        start, tokens, matcher = self._starts[row], self._tokens[row], self.matchers[row]
        if first < start:  # a shorter prompt's row: its prompt's columns are not its output
            ids = ids[start - first :]
        base = max(0, first - start)
        common, limit = 0, min(len(tokens) - base, len(ids))
        while common < limit and tokens[base + common] == ids[common]:
            common += 1
        kept = base + common
        if kept < len(tokens):
            del tokens[kept:]
            if self._fed[row] > kept:
                matcher.rollback(self._fed[row] - kept)
                self._fed[row] = kept
        tokens.extend(ids[common:])
        fed = self._fed[row]
        while fed < len(tokens) and not matcher.is_terminated():
            if not matcher.accept_token(int(tokens[fed])):
                break
            fed += 1
        self._fed[row] = fed
        if not matcher.is_terminated() and len(tokens) - fed > LOOKBACK_TOKENS:
            raise RuntimeError(
                f"row {row}: the grammar refused generated token {tokens[fed]} and it stayed "
                "(did another processor or beam search change the tokens?)"
            )


def _end_words(vocabulary: Vocabulary, eos_token_id: int | Sequence[int] | None) -> Any:
    """The mask words that clear the stop tokens other than ``eos_token_id`` (``None`` when
    it is not given).

    Raises:
        ValueError: none of ``eos_token_id`` is one of the vocabulary's stop tokens.
    """
    if eos_token_id is None:
        return None
    ends = {int(eos_token_id)} if isinstance(eos_token_id, int) else set(map(int, eos_token_id))
    if not ends & vocabulary.eos_ids:
        raise ValueError(
            f"eos_token_id {sorted(ends)} holds none of the vocabulary's stop tokens "
            f"{sorted(vocabulary.eos_ids)}"
        )
    words = allocate_token_bitmask(1, vocabulary.size).shape[1]
    keep = np.full(words, 0xFFFFFFFF, dtype=np.uint32)
    for token in vocabulary.eos_ids - ends:
        keep[token >> 5] &= ~np.uint32(1 << (token & 31))
    return keep.view(np.int32)
