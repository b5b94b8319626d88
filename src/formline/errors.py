"""``FormlineError``: the one root of the errors formline raises on purpose.

``except formline.FormlineError`` catches a malformed grammar, schema or vocabulary, a
compile past its budget, a token the grammar refuses, a model engine's failure, and an
output that was cut off or failed its after-check. Each layer's error also keeps the
built-in base it always had (``ValueError`` for bad input, ``RuntimeError`` for an engine),
so existing ``except ValueError`` code still works. A leaf module: it imports nothing.
"""

from __future__ import annotations


class FormlineError(Exception):
    """The root of formline's errors (see the module's doc)."""
