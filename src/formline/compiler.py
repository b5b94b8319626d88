"""``GrammarCompiler``: the one compiler object, in XGrammar's shape, bound to a vocabulary.

It owns a :class:`~formline.mask.compiler.CompileCache` (token trie, compiled grammars,
schema grammars, disk store, all behind one lock never held while compiling), so it is safe
to share between threads and a compile of one schema never waits for another's. The
module-level ``formline.mask.compile_grammar`` and ``formline.schema.compile_schema`` use the
process-wide default cache the same way.
"""

from __future__ import annotations

import os
from typing import Any

from formline.grammar.budget import CompileBudget
from formline.grammar.ir import Grammar
from formline.mask.compiled import CompiledGrammar
from formline.mask.compiler import (
    DEFAULT_CACHE_LIMIT_BYTES,
    DEFAULT_DISK_LIMIT_BYTES,
    CompileCache,
    check_vocabulary,
)
from formline.schema.api import CompiledSchema, compile_schema
from formline.vocab import Vocabulary


class GrammarCompiler:
    """Compiles grammars, regexes, choices and JSON Schemas for one vocabulary.

    Args:
        vocabulary: the model's vocabulary.
        cache_limit_bytes: memory for compiled grammars and their masks (LRU past it).
        disk_cache: ``False`` (default: a load costs more than a build, see
            :func:`~formline.mask.compile_grammar`), ``True`` (default folder) or a path;
            entries are arrays and JSON, never pickle, and are checked before use.
        disk_limit_bytes: size of the disk store (LRU past it).
        budget: the time and state limits of each compile (:class:`CompileBudget`); every
            ``compile_*`` method also takes ``budget=`` for one call.

    Every ``compile_*`` method raises ``GrammarError`` (or ``SchemaError``) naming what is
    wrong, and ``CompileLimitError`` past a limit of the budget, in bounded time. Each costs the
    automaton build the first time (milliseconds for most schemas) and a lookup afterwards;
    masks are computed lazily by the matcher.
    """

    def __init__(
        self,
        vocabulary: Vocabulary,
        *,
        cache_limit_bytes: int = DEFAULT_CACHE_LIMIT_BYTES,
        disk_cache: bool | str | os.PathLike[str] = False,
        disk_limit_bytes: int = DEFAULT_DISK_LIMIT_BYTES,
        budget: CompileBudget | None = None,
    ):
        check_vocabulary(vocabulary)
        self.vocabulary = vocabulary
        self.budget = budget or CompileBudget()
        self.cache = CompileCache(cache_limit_bytes, disk_cache, disk_limit_bytes)

    def compile_grammar(
        self, grammar: Grammar | str, start: str = "root", budget: CompileBudget | None = None
    ) -> CompiledGrammar:
        """A :class:`Grammar`, or EBNF/GBNF text, compiled for the vocabulary."""
        if isinstance(grammar, str):
            grammar = Grammar.from_ebnf(grammar, start)
        return self.cache.compile(grammar, self.vocabulary, budget or self.budget)

    def compile_regex(self, pattern: str, budget: CompileBudget | None = None) -> CompiledGrammar:
        """A regular expression (Python syntax, ASCII classes, no lookaround)."""
        return self.compile_grammar(Grammar.from_regex(pattern), budget=budget)

    def compile_choice(
        self, choices: list[str] | tuple[str, ...], budget: CompileBudget | None = None
    ) -> CompiledGrammar:
        """Exactly one of ``choices``."""
        return self.compile_grammar(Grammar.from_choices(choices), budget=budget)

    def compile_json_schema(
        self, schema: Any, budget: CompileBudget | None = None, **options: Any
    ) -> CompiledSchema:
        """A JSON Schema (dict, bool or JSON text) or a Pydantic model; ``options`` are
        :func:`formline.schema.compile_schema`'s (``whitespace``, ``on_unsupported``,
        ``max_string_length``)."""
        chosen = budget or self.budget
        return compile_schema(schema, self.vocabulary, cache=self.cache, budget=chosen, **options)

    def clear_cache(self) -> None:
        """Forget everything this compiler holds in memory (its disk store stays)."""
        self.cache.clear()
