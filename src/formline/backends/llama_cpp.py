"""The llama.cpp backend (``llama-cpp-python``): formline's own decoding loop on a GGUF model.

:class:`LlamaCppBackend` drives llama.cpp through its low-level API (``eval`` plus the logits
of the last position) so that formline masks, samples and jump-forwards itself.
:class:`LlamaCppLogitsProcessor` is for users of llama.cpp's own ``create_completion``: a
logits processor that keeps a :class:`GrammarMatcher` in step with the sampled tokens.

``llama_cpp`` is imported lazily (in :class:`LlamaCppBackend`'s constructor), so importing this
module costs nothing. Output text is built from the formline vocabulary's token bytes, not
``Llama.detokenize``: llama-cpp-python 0.3.36 detokenizes through a 32-byte buffer and silently
drops every longer piece (47 of SmolLM2's tokens, e.g. 64 dashes or a newline plus 32 spaces).
"""

from __future__ import annotations

import atexit
import time
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
from formline.mask.bitmask import allocate_token_bitmask, apply_token_bitmask_inplace
from formline.mask.matcher import GrammarMatcher
from formline.vocab import Vocabulary
from formline.vocab.vocabulary import VocabularyError

LLAMA_SEED = 0  # llama.cpp's own sampler seed (used only by create_completion users)


class LlamaCppBackend:
    """A GGUF model run by llama.cpp, constrained by formline masks.

    Args:
        model_path: the GGUF file.
        n_ctx: context size in tokens (prompt plus completion).
        n_threads: CPU threads for decoding and for the prompt (``None``: llama.cpp's
            defaults, half the cores for decoding and all of them for the prompt).
        verbose: llama.cpp's own logging on stderr.

    Raises:
        BackendError: ``llama_cpp`` is not installed, the file is missing or does not load, or
            the GGUF tokenizer has more tokens than the model has logits.
    Loading costs about 0.15 s for SmolLM2-135M plus about 0.1 s for the vocabulary.
    """

    name = "llama_cpp"

    def __init__(
        self,
        model_path: Path,
        n_ctx: int = 2048,
        n_threads: int | None = None,
        verbose: bool = False,
    ):
        try:
            import llama_cpp
        except ImportError as error:
            raise BackendError(
                "the llama_cpp backend needs llama-cpp-python: pip install llama-cpp-python"
            ) from error
        self.model_path = Path(model_path)
        if not self.model_path.is_file():
            raise BackendError(f"no GGUF model file at {self.model_path}")
        try:
            self.llm = llama_cpp.Llama(
                str(self.model_path),
                n_ctx=n_ctx,
                n_threads=n_threads,
                # llama.cpp's batch default is every core; its threads spin-wait, so one busy
                # core stalls a 2-core prompt pass (0.2 s became 0.5-2.4 s for 32 tokens).
                n_threads_batch=n_threads,
                logits_all=False,
                verbose=verbose,
                seed=LLAMA_SEED,
            )
        except (ValueError, RuntimeError) as error:
            raise BackendError(f"llama.cpp cannot load {self.model_path}: {error}") from error
        self._llama_cpp = llama_cpp
        # Free the model before interpreter shutdown: freed during module teardown,
        # llama-cpp-python 0.3.36 calls an already-collected C function ("'NoneType' object
        # is not callable" printed at exit).
        atexit.register(self.llm.close)
        self.n_vocab = int(self.llm.n_vocab())
        try:
            # The logits size is the vocabulary size; ids beyond the tokenizer become padding.
            self.vocabulary = Vocabulary.from_gguf(self.model_path, vocab_size=self.n_vocab)
        except VocabularyError as error:
            raise BackendError(f"the GGUF tokenizer does not fit the model: {error}") from error
        self._eos_ids = frozenset(self.vocabulary.eos_ids)
        self._chat_formatter: Any = None

    # ----------------------------------------------------------------- prompts

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """The prompt for ``messages`` from the GGUF's own ``tokenizer.chat_template``.

        Rendered by llama_cpp's ``Jinja2ChatFormatter`` (sandboxed jinja2, trim_blocks,
        lstrip_blocks, Transformers' ``tojson``) with ``add_generation_prompt=True`` and the
        model's bos/eos token texts.

        Raises:
            BackendError: the GGUF has no chat template, or the template fails to render.
        The first call compiles the template (milliseconds); later calls only render.
        """
        if self._chat_formatter is None:
            template = self.llm.metadata.get("tokenizer.chat_template")
            if not template:
                raise BackendError(f"{self.model_path.name} has no tokenizer.chat_template")
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            model = self.llm._model
            self._chat_formatter = Jinja2ChatFormatter(
                template=template,
                eos_token=model.token_get_text(self.llm.token_eos()),
                bos_token=model.token_get_text(self.llm.token_bos()),
                add_generation_prompt=True,
            )
        try:
            return str(self._chat_formatter(messages=messages).prompt)
        except Exception as error:  # jinja2 raises many types; all mean "cannot render"
            raise BackendError(f"the chat template failed to render: {error}") from error

    def tokenize_prompt(self, prompt: str) -> list[int]:
        """The prompt's tokens: special-token texts parsed, a bos added where the model asks
        for one (never twice, when the text already starts with it).

        Raises:
            BackendError: the prompt is empty and the model has no bos token to start from.
        """
        tokens = list(self.llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True))
        bos = self.llm.token_bos()
        if len(tokens) >= 2 and tokens[0] == tokens[1] == bos:
            del tokens[0]
        if not tokens:
            if bos < 0:
                raise BackendError("an empty prompt needs a bos token, and the model has none")
            tokens = [bos]
        return tokens

    # ---------------------------------------------------------------- decoding

    def generate(
        self, prompt: str, matcher: GrammarMatcher | None, sampling: Sampling
    ) -> Generation:
        """Decode from ``prompt``, constrained by ``matcher`` when given.

        Each step masks the last logits (``fill_next_token_bitmask`` and
        ``apply_token_bitmask_inplace``), picks a token (argmax when ``temperature == 0``,
        else temperature and top-p with ``numpy.random.default_rng(seed)``), accepts it, and
        evaluates it. With ``sampling.jump_forward`` the text the grammar forces next
        (``find_jump_forward_string``) is tokenized *on its own* (its canonical tokenization,
        which can differ from how the model would split it in context) and fed in the same
        forward pass as the sampled token; a forced token the matcher refuses cancels that
        jump (validity never depends on the tokenization). The grammar's end (only stop
        tokens allowed) finishes without another forward pass.

        Raises:
            BackendError: the prompt does not fit ``n_ctx``, or llama.cpp fails to evaluate.
            RuntimeError: the matcher refuses a token its own mask allowed (a formline bug).
        Costs one forward pass per sampled token (7-10 ms for SmolLM2-135M Q4_1 on one CPU
        thread) plus, constrained, a mask and an accept (about 0.3 ms). On a CPU a pass of k
        tokens costs nearly k single passes (measured: 8 tokens 45 ms, 1 token 7 ms), so
        jump-forward saves passes (a quarter on a JSON schema) but only about 10% of time.
        """
        started = time.perf_counter()
        prompt_ids = self.tokenize_prompt(prompt)
        if len(prompt_ids) >= self.llm.n_ctx():
            raise BackendError(
                f"the prompt has {len(prompt_ids)} tokens; n_ctx is {self.llm.n_ctx()}"
            )
        counters = LoopCounters()
        gate = StepGate(sampling)
        rng = np.random.default_rng(sampling.seed)
        output: list[int] = []
        if sampling.jump_forward and matcher is not None:
            # A grammar can force its opening bytes ('{"name":"'): they share the prompt's pass.
            room = min(sampling.max_tokens, self.llm.n_ctx() - len(prompt_ids) - 1)
            output = self._forced_tokens(matcher, room)
            counters.jump_forward_tokens = counters.forward_passes_saved = len(output)
        self.llm.reset()
        logits = self._forward(prompt_ids + output, counters)
        counters.prompt_seconds = counters.forward_seconds
        if matcher is not None and output and _only_stop_allowed(matcher):
            finish = "stop"  # the grammar forced all of its text
        else:
            finish = self._decode(logits, matcher, sampling, rng, output, counters, gate)
        gate.check(output)  # the last tokens reach a streaming listener too
        return self._generation(prompt_ids, output, finish, counters, started)

    def _decode(
        self,
        logits: np.ndarray,
        matcher: GrammarMatcher | None,
        sampling: Sampling,
        rng: np.random.Generator,
        output: list[int],
        counters: LoopCounters,
        gate: StepGate,
    ) -> str:
        """The step loop; appends to ``output`` and returns the finish reason."""
        bitmask = allocate_token_bitmask(1, self.n_vocab)
        scratch = np.empty(self.n_vocab, dtype=np.float32)  # the pressure measure's buffer
        limit = self.llm.n_ctx()
        while len(output) < sampling.max_tokens and self.llm.n_tokens < limit:
            stopped = gate.check(output)
            if stopped:
                return stopped
            if matcher is not None:
                begun = time.perf_counter()
                matcher.fill_next_token_bitmask(bitmask)
                counters.pressure[len(output)] = apply_mask_measuring(logits, bitmask[0], scratch)
                counters.mask_seconds += time.perf_counter() - begun
            if matcher is not None and sampling.close_within_budget:
                closing = closing_tokens(
                    matcher,
                    sampling.max_tokens - len(output),
                    self._tokenize_bytes,
                    self.vocabulary.token_bytes,
                )
                if closing:
                    output.extend(closing)
                    counters.closing_tokens = len(closing)
                    return "stop"
            token = choose_token(logits, sampling.temperature, sampling.top_p, rng)
            if matcher is not None and not matcher.accept_token(token):
                raise RuntimeError(
                    f"formline bug: the matcher refused token {token} "
                    f"({self.vocabulary.token_bytes[token]!r}) that its own mask allowed"
                )
            if token in self._eos_ids or (matcher is not None and matcher.is_terminated()):
                return "stop"
            output.append(token)
            if matcher is not None and _only_stop_allowed(matcher):
                return "stop"
            step = [token]
            if sampling.jump_forward and matcher is not None:
                room = min(sampling.max_tokens - len(output), limit - self.llm.n_tokens - 1)
                forced = self._forced_tokens(matcher, room)
                step.extend(forced)
                output.extend(forced)
                counters.jump_forward_tokens += len(forced)
                counters.forward_passes_saved += len(forced)
                if forced and _only_stop_allowed(matcher):
                    return "stop"
            if len(output) >= sampling.max_tokens:
                break  # no pass for logits nobody will read
            logits = self._forward(step, counters)
        return "length"

    def _tokenize_bytes(self, text: bytes) -> list[int]:
        tokens: list[int] = self.llm.tokenize(text, add_bos=False, special=False)
        return tokens

    def _forced_tokens(self, matcher: GrammarMatcher, room: int) -> list[int]:
        """The tokens of the grammar's forced text, accepted by ``matcher``; ``[]`` (and
        the matcher unchanged) when nothing is forced, there is no room, or the forced text's
        own tokens do not spell it (e.g. SentencePiece's leading space). At most ``room``
        tokens: a cut leaves the rest for the next steps."""
        if room <= 0:
            return []
        forced = matcher.find_jump_forward_string().encode("utf-8")
        if not forced:
            return []
        tokens = self.llm.tokenize(forced, add_bos=False, special=False)
        pieces = self.vocabulary.token_bytes
        if b"".join(pieces[token] for token in tokens) != forced:
            return []
        accepted: list[int] = []
        for token in tokens[:room]:
            if not matcher.accept_token(token):  # not expected after the spelling check
                matcher.rollback(len(accepted))
                return []
            accepted.append(token)
        return accepted

    def _forward(self, tokens: list[int], counters: LoopCounters) -> np.ndarray:
        """Evaluate ``tokens`` in one call and return a float32 copy of the last logits.

        Raises:
            BackendError: llama.cpp fails to decode (e.g. the context is full).
        """
        begun = time.perf_counter()
        try:
            self.llm.eval(tokens)
        except RuntimeError as error:
            raise BackendError(
                f"llama.cpp failed to evaluate {len(tokens)} tokens: {error}"
            ) from error
        pointer = self._llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        logits = np.ctypeslib.as_array(pointer, shape=(self.n_vocab,)).astype(np.float32)
        counters.forward_seconds += time.perf_counter() - begun
        counters.forward_passes += 1
        return logits

    def _generation(
        self,
        prompt_ids: list[int],
        output: list[int],
        finish: str,
        counters: LoopCounters,
        started: float,
    ) -> Generation:
        special = self.vocabulary.special_ids
        pieces = self.vocabulary.token_bytes
        data = b"".join(pieces[token] for token in output if token not in special)
        return counters.generation(
            output,
            data.decode("utf-8", errors="replace"),
            finish,
            len(prompt_ids),
            prompt_seconds=counters.prompt_seconds,
            total_seconds=time.perf_counter() - started,
        )


def _only_stop_allowed(matcher: GrammarMatcher) -> bool:
    """Whether the grammar has ended: only stop tokens are allowed next. Costs nothing
    unless the text can end, then one comparison of ceil(V/32) words (1,536 for SmolLM2)."""
    if not matcher.can_end():
        return False
    return bool(np.array_equal(matcher.next_token_mask_words(), matcher.compiled.eos_mask))


def choose_token(
    logits: np.ndarray, temperature: float, top_p: float, rng: np.random.Generator
) -> int:
    """The next token: argmax when ``temperature <= 0``, else a draw from the softmax of
    ``logits / temperature`` cut to the smallest top-``top_p`` nucleus.

    Raises:
        RuntimeError: no token has a finite logit (a mask that allows nothing).
    Costs O(V) for greedy; sampling adds an O(V log V) sort of the allowed tokens when
    ``top_p < 1`` (about 3 ms for 49k unmasked tokens).
    """
    if temperature <= 0:
        token = int(np.argmax(logits))
        if not np.isfinite(logits[token]):
            raise RuntimeError("no token has a finite logit: the mask allows nothing")
        return token
    ids = np.flatnonzero(np.isfinite(logits))
    if ids.size == 0:
        raise RuntimeError("no token has a finite logit: the mask allows nothing")
    scaled = logits[ids].astype(np.float64) / temperature
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    if top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cut = int(np.searchsorted(np.cumsum(probs[order]), top_p)) + 1
        ids, probs = ids[order[:cut]], probs[order[:cut]]
    cumulative = np.cumsum(probs)
    pick = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return int(ids[min(pick, ids.size - 1)])


class LlamaCppLogitsProcessor:
    """A llama-cpp-python logits processor that enforces a grammar in ``create_completion``.

    Use one per completion: ``llm.create_completion(prompt,
    logits_processor=LogitsProcessorList([LlamaCppLogitsProcessor(matcher)]))``. Each call
    accepts the tokens llama.cpp sampled since the last call (``input_ids`` beyond the prompt)
    and masks ``scores`` (indexed by token id). The prompt length is taken from the first call
    unless ``prompt_tokens`` is given. llama.cpp stops on its end-of-generation tokens without
    showing them here, so the matcher never sees the stop token.

    Raises (from ``__call__``):
        RuntimeError: the matcher refuses a sampled token (another processor or sampler
            changed the masked scores, or the processor is reused across completions).
    Costs, per token, the accept plus a mask (a cached lookup and an O(V) apply on a copy).
    """

    def __init__(self, matcher: GrammarMatcher, prompt_tokens: int | None = None):
        self.matcher = matcher
        self.prompt_tokens = prompt_tokens
        self.seen = 0
        self._bitmask = allocate_token_bitmask(1, matcher.compiled.vocabulary_size)

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        if self.prompt_tokens is None:
            self.prompt_tokens = len(input_ids)
        for token in input_ids[self.prompt_tokens + self.seen :]:
            if not self.matcher.accept_token(int(token)):
                raise RuntimeError(f"the grammar refuses token {int(token)} that llama.cpp sampled")
            self.seen += 1
        masked = np.array(scores, dtype=np.float32, copy=True)
        self.matcher.fill_next_token_bitmask(self._bitmask)
        apply_token_bitmask_inplace(masked, self._bitmask[0])
        return masked
