"""The Hugging Face transformers backend, and a logits processor for ``model.generate``.

:class:`TransformersBackend` runs formline's own decoding loop on a ``transformers`` causal LM
(a GGUF file, dequantized on load, or a model directory): one forward pass per token with the
KV cache, the matcher's bitmask applied to the last logits, and jump-forward (the grammar's
forced text fed in one pass). :class:`FormlineLogitsProcessor` plugs a compiled grammar into
the user's own ``model.generate(...)`` (greedy, sampling, batches with left padding).

This is the only formline module that imports torch and transformers.
"""

from __future__ import annotations

import bisect
import functools
import importlib.util
import inspect
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from formline.backends.base import (
    BackendError,
    Generation,
    LoopCounters,
    Sampling,
    StepGate,
    apply_mask_measuring,
    closing_tokens,
)
from formline.mask.batch import default_batch_matcher
from formline.mask.bitmask import allocate_token_bitmask, apply_token_bitmask_inplace
from formline.mask.compiled import CompiledGrammar
from formline.mask.matcher import GrammarMatcher
from formline.vocab import Vocabulary
from formline.vocab.vocabulary import VocabularyError

try:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessor
except ImportError as _error:  # pragma: no cover - depends on the environment
    raise BackendError(
        "the transformers backend needs torch and transformers: "
        "pip install 'formline[hf]' torch accelerate"
    ) from _error

MAX_BACK_OFF = 4  # trailing forced tokens re-checked for a merge across the end (llguidance: 4)


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
        parameters = inspect.signature(self.model.forward).parameters
        # logits_to_keep=1 skips the LM head on all but the last position: the head is
        # 49,152 x 576 = 28M multiply-adds per position for SmolLM2 (a fifth of the model).
        self._keep_last = {"logits_to_keep": 1} if "logits_to_keep" in parameters else {}
        # transformers 5.x names the KV cache ``cache`` (``past_key_values`` is deprecated,
        # removed in 5.40); 4.x only knows ``past_key_values``.
        self._cache_name = "cache" if "cache" in parameters else "past_key_values"

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """The model's chat template applied to ``messages``, assistant turn opened.

        Raises:
            BackendError: the tokenizer has no chat template.
        """
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
        except ValueError as error:  # transformers: "no chat template"
            raise BackendError(f"{self.model_path}: {error}") from error
        return str(text)

    def encode_prompt(self, prompt: str) -> list[int]:
        """Prompt token ids: the tokenizer's special tokens (BOS) are added unless the text
        already starts with them (a rendered chat template carries its own)."""
        bos = getattr(self.tokenizer, "bos_token", None)
        add_special = not (bos and prompt.startswith(bos))
        return list(self.tokenizer(prompt, add_special_tokens=add_special)["input_ids"])

    def generate(
        self, prompt: str, matcher: GrammarMatcher | None, sampling: Sampling
    ) -> Generation:
        """Decode from ``prompt``, constrained by ``matcher`` when given.

        Greedy at ``temperature == 0``, else temperature and top-p sampling from a
        ``torch.Generator`` seeded with ``sampling.seed`` (same seed, same output). Stops at
        an eos id, the matcher's end, or ``max_tokens`` (finish_reason ``"length"``).

        Raises:
            RuntimeError: the matcher refused a token its own mask allowed, or allowed no
                token at all (both are formline bugs).
        Costs one forward pass per token (41 ms for SmolLM2-135M in float32 on a CPU core)
        plus, when constrained, one mask fill and apply (0.15-0.3 ms measured on a JSON
        schema); a jump-forward feeds its forced tokens with the next sampled one in one pass.
        """
        generator = torch.Generator()
        if sampling.seed is None:
            generator.seed()
        else:
            generator.manual_seed(sampling.seed)
        prompt_ids = self.encode_prompt(prompt)
        loop = _Loop(self, matcher, sampling, generator)
        loop.run(prompt_ids)
        output = loop.output
        stopped = loop.finish_reason == "stop" and output and output[-1] in self.vocabulary.eos_ids
        text_ids = output[:-1] if stopped else output
        return loop.counters.generation(
            list(output),
            self.tokenizer.decode(text_ids, skip_special_tokens=False),
            loop.finish_reason,
            len(prompt_ids),
            device=str(self.device),
        )

    @functools.cached_property
    def prefix_index(self) -> PrefixIndex:
        """Tokens sorted by bytes, for jump-forward's back-off (built on first use)."""
        return PrefixIndex(self.vocabulary)

    def forward(self, token_ids: list[int], cache: Any) -> tuple[Any, Any]:
        """One forward pass over ``token_ids`` after ``cache``: (last logits on the CPU as
        float32, the new cache). Costs one model call."""
        input_ids = torch.tensor([token_ids], dtype=torch.long, device=self.device)
        options = {self._cache_name: cache, "use_cache": True, **self._keep_last}
        with torch.no_grad():  # not inference_mode: the logits are masked in place after
            out = self.model(input_ids=input_ids, **options)
        return out.logits[0, -1].float().cpu(), getattr(out, self._cache_name)


class _Loop:
    """One decoding loop's state and counters (see :meth:`TransformersBackend.generate`)."""

    def __init__(
        self,
        backend: TransformersBackend,
        matcher: GrammarMatcher | None,
        sampling: Sampling,
        generator: Any,
    ):
        self.backend, self.matcher, self.sampling = backend, matcher, sampling
        self.generator = generator
        self.output: list[int] = []
        self.finish_reason = "length"
        self.counters = LoopCounters()
        # One (1, words) int32 bitmask per loop, applied by numpy to a view of the CPU logits
        # (0.07 ms for 49k logits; torch's apply takes 0.06 ms but runs on its thread pool).
        self.bitmask = allocate_token_bitmask(1, backend.logits_size)
        self.scratch = np.empty(backend.logits_size, dtype=np.float32)  # pressure buffer
        self.gate = StepGate(sampling)

    def run(self, prompt_ids: list[int]) -> None:
        self._steps(prompt_ids)
        self.gate.check(self.output)  # the last tokens reach a streaming listener too

    def _steps(self, prompt_ids: list[int]) -> None:
        eos_ids = self.backend.vocabulary.eos_ids
        pending, cache = prompt_ids, None
        while len(self.output) < self.sampling.max_tokens:
            stopped = self.gate.check(self.output)
            if stopped:
                self.finish_reason = stopped
                return
            started = time.perf_counter()
            logits, cache = self.backend.forward(pending, cache)
            self.counters.forward_seconds += time.perf_counter() - started
            self.counters.forward_passes += 1
            if self.output:  # the prompt pass saves nothing
                self.counters.forward_passes_saved += len(pending) - 1
            if self.close_within_budget():
                return
            token = self.choose(logits)
            self.output.append(token)
            if token in eos_ids or (self.matcher is not None and self.matcher.is_terminated()):
                self.finish_reason = "stop"
                return
            forced = self.jump_forward()
            self.output.extend(forced)
            self.counters.jump_forward_tokens += len(forced)
            pending = [token, *forced]

    def close_within_budget(self) -> bool:
        """Write the shortest completion when it only just fits (see ``closing_tokens``)."""
        if self.matcher is None or not self.sampling.close_within_budget:
            return False
        closing = closing_tokens(
            self.matcher,
            self.sampling.max_tokens - len(self.output),
            self._tokenize,
            self.backend.vocabulary.token_bytes,
        )
        self.output.extend(closing)
        self.counters.closing_tokens = len(closing)
        if closing:
            self.finish_reason = "stop"
        return bool(closing)

    def _tokenize(self, text: bytes) -> list[int]:
        ids: list[int] = self.backend.tokenizer.encode(
            text.decode("utf-8", errors="replace"), add_special_tokens=False
        )
        return ids

    def choose(self, logits: Any) -> int:
        """Mask, pick and (when constrained) accept the next token."""
        matcher = self.matcher
        if matcher is not None:
            started = time.perf_counter()
            matcher.fill_next_token_bitmask(self.bitmask)
            values = logits.numpy()  # shares memory with the tensor
            self.counters.pressure[len(self.output)] = apply_mask_measuring(
                values, self.bitmask[0], self.scratch
            )
            self.counters.mask_seconds += time.perf_counter() - started
            if not np.isfinite(values).any():
                raise RuntimeError("formline bug: the grammar mask allows no token")
        token = pick_token(logits, self.sampling, self.generator)
        if matcher is not None and not matcher.accept_token(token):
            raise RuntimeError(f"formline bug: the matcher refused token {token} its mask allowed")
        return token

    def jump_forward(self) -> list[int]:
        """Accept the grammar's forced text as tokens; ``[]`` when there is none, it does not
        tokenize into tokens the matcher accepts, or no budget is left."""
        matcher = self.matcher
        budget = self.sampling.max_tokens - len(self.output)
        if matcher is None or not self.sampling.jump_forward or budget <= 0:
            return []
        forced = matcher.find_jump_forward_string()
        if not forced:
            return []
        ids = self.backend.tokenizer.encode(forced, add_special_tokens=False)[:budget]
        if matcher.max_rollback_tokens is not None:  # keep every accepted token undoable
            ids = ids[: matcher.max_rollback_tokens]
        for accepted, token in enumerate(ids):
            if not 0 <= token < self.backend.logits_size or not matcher.accept_token(token):
                matcher.rollback(accepted)
                return []
        return list(ids[: self.back_off(ids)])

    def back_off(self, ids: list[int]) -> int:
        """How many of the accepted forced ``ids`` to keep; the matcher ends after them.

        The forced text is tokenized on its own, so its last tokens may split what the model
        would write as one token across the end of the forced text: forcing ``"The capital
        of "`` as ``[The, capital, of, " "]`` leaves a lone space where SmolLM2 writes
        ``" France"``. As llguidance does, up to ``MAX_BACK_OFF`` trailing tokens are
        dropped while a token the grammar allows at their start would extend past them.
        Costs up to 4 rollbacks and mask lookups plus a scan of the tokens with that prefix.
        """
        matcher = self.matcher
        assert matcher is not None
        index = self.backend.prefix_index
        token_bytes = self.backend.vocabulary.token_bytes
        keep, suffix = len(ids), b""
        first = max(0, len(ids) - MAX_BACK_OFF)
        for start in range(len(ids) - 1, first - 1, -1):
            matcher.rollback(1)
            suffix = token_bytes[ids[start]] + suffix
            if index.extended_by_allowed(suffix, matcher.next_token_mask_words()):
                keep = start
        for token in ids[first:keep]:
            matcher.accept_token(token)
        return keep


class PrefixIndex:
    """The vocabulary's text tokens sorted by bytes: the tokens extending a byte string
    form one contiguous run. Building costs one sort (about 40 ms for 49k tokens)."""

    def __init__(self, vocabulary: Vocabulary):
        special = vocabulary.special_ids
        pairs = sorted(
            (piece, token)
            for token, piece in enumerate(vocabulary.token_bytes)
            if piece and token not in special
        )
        self.keys = [piece for piece, _ in pairs]
        self.ids = np.array([token for _, token in pairs], dtype=np.int64)
        self.lengths = np.array([len(piece) for piece in self.keys], dtype=np.int64)

    def extended_by_allowed(self, prefix: bytes, mask_words: np.ndarray) -> bool:
        """Whether a token longer than ``prefix`` that starts with it is allowed by
        ``mask_words`` (uint32, bit ``t`` = token ``t``). Costs O(log V + matching tokens)."""
        low = bisect.bisect_left(self.keys, prefix)
        high = bisect.bisect_right(self.keys, prefix, lo=low, key=lambda key: key[: len(prefix)])
        candidates = self.ids[low:high][self.lengths[low:high] > len(prefix)]
        words = np.asarray(mask_words).view(np.uint32)[candidates >> 5]
        return bool(((words >> (candidates & 31).astype(np.uint32)) & 1).any())


def pick_token(logits: Any, sampling: Sampling, generator: Any) -> int:
    """Greedy (``temperature == 0``) or temperature + top-p sampling from 1-D ``logits``.

    Costs one softmax and, for ``top_p < 1``, a sort of the tokens the mask allows:
    4 ms for all 49k logits on one core (a tenth of a SmolLM2 forward pass).
    """
    if sampling.temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        allowed = torch.nonzero(probs > 0).squeeze(1)  # masked tokens have probability 0
        sorted_probs, order = torch.sort(probs[allowed], descending=True)
        # Keep the smallest prefix whose mass reaches top_p (always at least the top token).
        keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < sampling.top_p
        keep[0] = True
        probs = torch.zeros_like(probs)
        probs[allowed[order[keep]]] = sorted_probs[keep]
    return int(torch.multinomial(probs, 1, generator=generator))


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
    except (OSError, ValueError, KeyError) as error:
        raise BackendError(f"{path}: transformers cannot load the model: {error}") from error
    return tokenizer, model


class FormlineLogitsProcessor(LogitsProcessor):
    """A grammar constraint for ``model.generate(..., logits_processor=[processor])``.

    Keeps one :class:`GrammarMatcher` per batch row, created at the first call. Each call
    accepts the rows' new tokens (``input_ids[row, prompt_length:]``) and masks every row's
    scores with one batched ``(batch, words)`` bitmask; a row whose matcher has accepted a
    stop token gets only eos allowed. Works with greedy and sampling (``generate`` applies
    temperature and top-p after this processor) and with left-padded batches. Beam search
    is not supported (beams reorder rows). Use a fresh processor per ``generate`` call.

    Args:
        grammar: a :class:`CompiledGrammar`, or an object with ``.compiled_grammar`` (a
            ``CompiledSchema``).
        prompt_length: the padded prompt length (``input_ids.shape[1]``), one per row, or
            ``None`` for the length of ``input_ids`` at the first call.

    Raises (at a call):
        RuntimeError: a row's matcher refused its generated token (another processor or
            beam search changed the tokens), or the batch size changed between calls.
    Costs per call: one mask fill per row (a cached lookup) and one vectorised apply.
    """

    def __init__(self, grammar: Any, prompt_length: int | Sequence[int] | None = None):
        compiled = getattr(grammar, "compiled_grammar", grammar)
        if not isinstance(compiled, CompiledGrammar):
            raise TypeError(
                f"expected a CompiledGrammar or an object with .compiled_grammar, "
                f"got {type(grammar).__name__}"
            )
        self.compiled = compiled
        self.prompt_length = prompt_length
        self.matchers: list[GrammarMatcher] = []
        self._seen: list[int] = []  # per row: the columns of input_ids already accepted
        self._bitmask: np.ndarray | None = None

    def _start(self, input_ids: Any) -> None:
        batch = int(input_ids.shape[0])
        length = self.prompt_length
        if length is None:
            length = int(input_ids.shape[1])
        starts = [int(length)] * batch if isinstance(length, int) else [int(n) for n in length]
        if len(starts) != batch:
            raise ValueError(f"{len(starts)} prompt lengths for a batch of {batch}")
        self.matchers = [GrammarMatcher(self.compiled) for _ in range(batch)]
        self._seen = starts
        self._bitmask = allocate_token_bitmask(batch, self.compiled.vocabulary_size)

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        """Accept the new tokens and mask ``scores`` (``(batch, vocab)``) in place."""
        if not self.matchers:
            self._start(input_ids)
        if int(input_ids.shape[0]) != len(self.matchers):
            raise RuntimeError(
                f"batch size changed from {len(self.matchers)} to {input_ids.shape[0]} "
                "(beam search is not supported; use a fresh processor per generate call)"
            )
        bitmask = self._bitmask
        assert bitmask is not None
        first = min(self._seen)  # copy only the columns not yet accepted (usually one)
        rows = input_ids[:, first:].tolist()
        for row, (matcher, ids) in enumerate(zip(self.matchers, rows, strict=True)):
            new = ids[self._seen[row] - first :]
            for token in new:
                if not matcher.is_terminated() and not matcher.accept_token(int(token)):
                    raise RuntimeError(
                        f"row {row}: the grammar refused generated token {token} "
                        "(did another processor or beam search change the tokens?)"
                    )
            self._seen[row] += len(new)
        default_batch_matcher().batch_fill_next_token_bitmask(self.matchers, bitmask)
        apply_token_bitmask_inplace(scores, bitmask)
        return scores
