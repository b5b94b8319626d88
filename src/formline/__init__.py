"""formline: language-model output that is valid by construction.

``formline.generate(prompt, output)`` decodes with a real local model under a JSON Schema,
a Pydantic model, a :class:`Regex`, a :class:`Choice` or a :class:`Grammar`.
``formline.stream(prompt, output)`` yields the value while it is decoded (partial, then
final). ``formline.extract(source, output)`` adds validation, grounding and a repair loop, and ends
in an :class:`Extraction` or a typed :class:`Failed`. The engine's
four objects live in :mod:`formline.grammar`, :mod:`formline.vocab`, :mod:`formline.mask`
and :mod:`formline.schema`. Importing formline imports no model engine.
"""

# First: the finder that loads the schema compiler's compiled modules, and the stand-in that
# defers rfc3987_syntax's parser (0.74 s of the import) until an iri value is checked.
from formline import _accelerated, _deferred  # noqa: F401
from formline.compiler import GrammarCompiler
from formline.constraint import Choice, Constraint, Regex
from formline.errors import FormlineError
from formline.grammar import Grammar
from formline.grammar.budget import CompileBudget, CompileLimitError
from formline.pipeline.extract import Extraction, Failed, extract
from formline.pipeline.generate import InvalidOutput, Result, TruncatedOutput, generate
from formline.pipeline.stream import Stream, stream

__version__ = "0.1.0"

__all__ = [
    "Choice",
    "CompileBudget",
    "CompileLimitError",
    "Constraint",
    "Extraction",
    "Failed",
    "FormlineError",
    "Grammar",
    "GrammarCompiler",
    "InvalidOutput",
    "Regex",
    "Result",
    "Stream",
    "TruncatedOutput",
    "extract",
    "generate",
    "stream",
]
