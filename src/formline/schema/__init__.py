"""JSON Schema and Pydantic models to grammars, with a report of every keyword.

``compile_schema(schema_or_model, vocabulary)`` gives a :class:`CompiledSchema`: the compiled
grammar for a :class:`~formline.mask.GrammarMatcher`, ``report`` (enforced / checked after /
unsupported, with JSON pointers) and ``check(instance)``, the after-check.
"""

from formline.schema.api import (
    CompiledSchema,
    compile_schema,
    schema_grammar,
    schema_of,
    schema_to_grammar,
)
from formline.schema.compiler import SchemaOptions
from formline.schema.report import KeywordUse, SchemaError, SchemaReport

__all__ = [
    "CompiledSchema",
    "KeywordUse",
    "SchemaError",
    "SchemaOptions",
    "SchemaReport",
    "compile_schema",
    "schema_grammar",
    "schema_of",
    "schema_to_grammar",
]
