"""Compiled grammars, matchers and token bitmasks."""

from formline.mask.batch import BatchGrammarMatcher
from formline.mask.bitmask import (
    allocate_token_bitmask,
    apply_token_bitmask_inplace,
    bitmask_to_ids,
)
from formline.mask.compiled import CompiledGrammar
from formline.mask.compiler import CompileCache, clear_memory_cache, compile_grammar
from formline.mask.matcher import GrammarMatcher, TokenError

__all__ = [
    "BatchGrammarMatcher",
    "CompileCache",
    "CompiledGrammar",
    "GrammarMatcher",
    "TokenError",
    "allocate_token_bitmask",
    "apply_token_bitmask_inplace",
    "bitmask_to_ids",
    "clear_memory_cache",
    "compile_grammar",
]
