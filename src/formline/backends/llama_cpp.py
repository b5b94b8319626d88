"""The llama.cpp backend (``llama-cpp-python``): a GGUF model as a formline engine.

:class:`LlamaCppBackend` exposes llama.cpp's low-level API (``eval`` plus the logits of the
last position) as the :class:`~formline.backends.base.Backend` interface, so that
formline's one decoding loop (:func:`formline.pipeline.decoding.decode`) masks, samples and
jump-forwards itself.
:class:`LlamaCppLogitsProcessor` is for users of llama.cpp's own ``create_completion``: a
logits processor that keeps a :class:`GrammarMatcher` in step with the sampled tokens.

``llama_cpp`` is imported lazily (in :class:`LlamaCppBackend`'s constructor), so importing this
module costs nothing. Output text is built from the formline vocabulary's token bytes, not
``Llama.detokenize``: llama-cpp-python 0.3.36 detokenizes through a 32-byte buffer and silently
drops every longer piece (47 of SmolLM2's tokens, e.g. 64 dashes or a newline plus 32 spaces).
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from formline.backends.base import BackendError, ChatTemplateError
from formline.backends.chat import render_guarded, special_text_pattern, tokenize_prompt_pieces
from formline.mask.bitmask import allocate_token_bitmask, apply_token_bitmask_inplace
from formline.mask.matcher import GrammarMatcher
from formline.vocab import Vocabulary
from formline.vocab.gguf_reader import GGUFTokenizer, read_gguf_tokenizer
from formline.vocab.vocabulary import VocabularyError

LLAMA_SEED = 0  # llama.cpp's own sampler seed (used only by create_completion users)
_PARAMETERS_LOCK = threading.Lock()


def has_amx(llama_cpp: Any) -> bool:
    """Whether this llama.cpp build would put the weights in its AMX buffers (an Intel CPU
    with AMX, llama.cpp built for it)."""
    info = llama_cpp.llama_print_system_info()
    text = info.decode("utf-8", "replace") if isinstance(info, bytes) else str(info)
    return "AMX_INT8 = 1" in text


@contextmanager
def _without_amx_buffers(llama_cpp: Any) -> Iterator[None]:
    """Models loaded inside load their weights without llama.cpp's extra CPU buffer types
    where the CPU has AMX: llama.cpp's AMX matrix product crashes the process (SIGSEGV in
    ``ggml_backend_amx_mul_mat``, llama.cpp issue 20824, open) on the first pass of two or
    more tokens, on this project's Xeon machines too (SmolLM2 Q4_1, llama-cpp-python
    0.3.36). Without them SmolLM2 decodes 56 tokens/s there (``bench.generate_bench --tasks
    2``, formline-free; the AMD EPYC's full run: 62); the AMX path cannot be measured, its
    prompt pass crashes. Elsewhere nothing changes. llama-cpp-python takes no
    ``use_extra_bufts`` argument, so the default parameters it reads are replaced while the
    model loads (under a lock)."""
    if not has_amx(llama_cpp):
        yield
        return
    module = llama_cpp.llama.llama_cpp
    defaults: Callable[[], Any] = module.llama_model_default_params

    def parameters() -> Any:
        chosen = defaults()
        chosen.use_extra_bufts = False
        return chosen

    with _PARAMETERS_LOCK:
        module.llama_model_default_params = parameters
        try:
            yield
        finally:
            module.llama_model_default_params = defaults


# The context a model gets unless asked otherwise: its trained one up to this many tokens (a
# 128k-token model's KV cache would take gigabytes; SmolLM2 at 8,192 holds 140 MB more than
# at 2,048 and loads 0.06 s slower).
DEFAULT_CONTEXT_CAP = 8192
FALLBACK_CONTEXT = 2048  # a GGUF that names no context length


def _trained_context(tokenizer: GGUFTokenizer | None) -> int:
    """``{architecture}.context_length`` of the GGUF whose header ``tokenizer`` holds, capped
    at :data:`DEFAULT_CONTEXT_CAP` (:data:`FALLBACK_CONTEXT` when it names none, or the
    header could not be read: llama.cpp then says why it cannot load the file)."""
    trained = tokenizer.context_length if tokenizer is not None else None
    return min(trained, DEFAULT_CONTEXT_CAP) if trained and trained > 0 else FALLBACK_CONTEXT


class LlamaCppBackend:
    """A GGUF model run by llama.cpp, constrained by formline masks.

    Args:
        model_path: the GGUF file.
        n_ctx: context size in tokens (prompt plus completion); ``None``: the context the
            model was trained with, at most :data:`DEFAULT_CONTEXT_CAP` (SmolLM2's 8,192:
            a fixed 2,048 refused a 2,300-token document the model reads).
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
        n_ctx: int | None = None,
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
        try:  # read once: the context length and the vocabulary (a second walk: 0.06 s)
            header: GGUFTokenizer | None = read_gguf_tokenizer(self.model_path)
        except VocabularyError:
            header = None  # llama.cpp names what is wrong with the file
        if n_ctx is None:
            n_ctx = _trained_context(header)
        try:
            with _without_amx_buffers(llama_cpp):
                self.llm = llama_cpp.Llama(
                    str(self.model_path),
                    n_ctx=n_ctx,
                    n_threads=n_threads,
                    # llama.cpp's batch default is every core; its threads spin-wait, so one
                    # busy core stalls a 2-core prompt pass (0.2 s became 0.5-2.4 s for 32
                    # tokens).
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
            self.vocabulary = Vocabulary.from_gguf(
                self.model_path, vocab_size=self.n_vocab, tokenizer=header
            )
        except VocabularyError as error:
            raise BackendError(f"the GGUF tokenizer does not fit the model: {error}") from error
        self._chat_formatter: Any = None
        self._special_texts = special_text_pattern(self.vocabulary)

    # ----------------------------------------------------------------- prompts

    @property
    def chat_template(self) -> str | None:
        """The GGUF's ``tokenizer.chat_template`` (``None``: it has none)."""
        template = self.llm.metadata.get("tokenizer.chat_template")
        return str(template) if template else None

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """The prompt for ``messages`` from the GGUF's own ``tokenizer.chat_template``.

        Rendered by llama_cpp's ``Jinja2ChatFormatter`` (sandboxed jinja2, trim_blocks,
        lstrip_blocks, Transformers' ``tojson``) with ``add_generation_prompt=True`` and the
        model's bos/eos token texts. A message whose text holds a special token's text keeps
        it as text (:mod:`formline.backends.chat`).

        Raises:
            BackendError: the GGUF has no chat template, or the template fails to render.
            ChatTemplateError: the template refused the messages, or changes a message text
                that holds a special token's text.
        The first call compiles the template (milliseconds); later calls only render (twice
        when a message holds a special token's text).
        """
        return render_guarded(self._render, messages, self._special_texts)

    def _render(self, messages: list[dict[str, str]]) -> str:
        """The template applied to ``messages`` (see :meth:`render_chat`)."""
        if self._chat_formatter is None:
            template = self.chat_template
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
        except ValueError as error:  # the template's raise_exception: the messages' fault
            raise ChatTemplateError(f"the chat template refused the messages: {error}") from error
        except Exception as error:  # jinja2 raises many types: the template's own fault
            raise BackendError(f"the chat template failed to render: {error}") from error

    def tokenize_prompt(self, prompt: str) -> list[int]:
        """The prompt's tokens: special-token texts parsed (not in a
        :class:`~formline.backends.chat.RenderedPrompt`'s text spans), a bos added where the
        model asks for one (never twice, when the text already starts with it).

        Raises:
            BackendError: the prompt is empty and the model has no bos token to start from.
        """
        tokens = tokenize_prompt_pieces(
            prompt, lambda text, bos, special: self.llm.tokenize(text.encode(), bos, special)
        )
        bos = self.llm.token_bos()
        if len(tokens) >= 2 and tokens[0] == tokens[1] == bos:
            del tokens[0]
        if not tokens:
            if bos < 0:
                raise BackendError("an empty prompt needs a bos token, and the model has none")
            tokens = [bos]
        return tokens

    # ------------------------------------------------------------ the engine

    @property
    def context_size(self) -> int:
        """``n_ctx``: the most tokens of one sequence."""
        return int(self.llm.n_ctx())

    def tokenize(self, text: bytes) -> list[int]:
        """``text``'s tokens alone: no bos, special-token texts left as text."""
        tokens: list[int] = self.llm.tokenize(text, add_bos=False, special=False)
        return tokens

    def reset(self) -> None:
        """Start a new sequence (llama.cpp's context forgets its tokens)."""
        self.llm.reset()

    def forward(self, token_ids: list[int]) -> np.ndarray:
        """Evaluate ``token_ids`` in one call; a float32 copy of the last logits.

        Raises:
            BackendError: llama.cpp fails to decode (e.g. the context is full).
        Costs one forward pass: 7-10 ms for SmolLM2-135M Q4_1 on one CPU thread (about 18
        on a CPU with AMX, whose AMX buffers are off: see _without_amx_buffers); a pass of k
        tokens costs nearly k single passes on a CPU (8 tokens 45 ms, 1 token 7 ms).
        """
        try:
            self.llm.eval(token_ids)
        except RuntimeError as error:
            raise BackendError(
                f"llama.cpp failed to evaluate {len(token_ids)} tokens: {error}"
            ) from error
        pointer = self._llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        return np.ctypeslib.as_array(pointer, shape=(self.n_vocab,)).astype(np.float32)


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
