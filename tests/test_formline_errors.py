"""Every error formline raises on purpose derives from ``formline.FormlineError`` and keeps
its built-in base (``ValueError`` for bad input, ``RuntimeError`` for an engine)."""

from __future__ import annotations

import pytest

import formline
from formline.backends.base import BackendError
from formline.grammar.ir import Grammar, GrammarError
from formline.mask import GrammarMatcher, TokenError, compile_grammar
from formline.mask.storage import StoredGrammarError
from formline.pipeline.extract import ExtractionFailed
from formline.schema import SchemaError, compile_schema
from formline.server.errors import ApiError
from formline.vocab import Vocabulary
from formline.vocab.vocabulary import VocabularyError


@pytest.mark.parametrize(
    ("error", "builtin"),
    [
        (GrammarError, ValueError),
        (formline.CompileLimitError, ValueError),
        (SchemaError, ValueError),
        (VocabularyError, ValueError),
        (TokenError, ValueError),
        (StoredGrammarError, ValueError),
        (formline.TruncatedOutput, ValueError),
        (formline.InvalidOutput, ValueError),
        (ExtractionFailed, ValueError),
        (BackendError, RuntimeError),
        (ApiError, Exception),
    ],
)
def test_each_error_derives_from_the_root_and_keeps_its_base(error: type, builtin: type) -> None:
    assert issubclass(error, formline.FormlineError) and issubclass(error, builtin)


def test_the_root_catches_real_failures(smollm2_vocab: Vocabulary) -> None:
    with pytest.raises(formline.FormlineError, match="unterminated group"):
        Grammar.from_regex("(a")
    with pytest.raises(formline.FormlineError, match="not a valid JSON Schema"):
        compile_schema({"type": "strnig"}, smollm2_vocab, disk_cache=False)
    matcher = GrammarMatcher(compile_grammar(Grammar.from_regex("a"), smollm2_vocab))
    with pytest.raises(formline.FormlineError):
        matcher.accept_token(smollm2_vocab.size + 5)
