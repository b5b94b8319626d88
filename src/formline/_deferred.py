"""Defers the third-party import that was most of formline's start-up: ``rfc3987_syntax``.

``jsonschema`` imports ``rfc3987_syntax`` (its checker of the ``iri`` and ``iri-reference``
formats, from ``jsonschema[format-nongpl]``) as it is itself imported, and that module builds
a Lark parser of RFC 3987 on import: 0.74 s of the 1.1 s that ``import formline`` took, and
120,000 of the process's 163,000 objects, which every full garbage collection then walks (30
ms a collection instead of 10.5, leaving the CPU's caches cold for what runs next).

:func:`defer`, called before formline first imports ``jsonschema``, puts a stand-in module
under that name in ``sys.modules``. ``jsonschema`` takes one function from it,
``is_valid_syntax``; the stand-in's version imports the real module on its first call (the
first ``iri`` value checked) and calls it. Any other attribute of the stand-in imports the
real module too, which then takes the stand-in's place. The checks themselves do not change.
Nothing is deferred when ``jsonschema`` or ``rfc3987_syntax`` was imported before formline,
or when ``rfc3987_syntax`` or the ``lark`` it builds its parser with is not installed (then
jsonschema's own import decides, as without formline).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import threading
import types
from typing import Any

NAME = "rfc3987_syntax"
_LOCK = threading.Lock()  # one thread imports the real module; the others wait for it


class DeferredModule(types.ModuleType):
    """The stand-in: the real module's spec, and its attributes fetched on first use."""

    def __init__(self, spec: importlib.machinery.ModuleSpec) -> None:
        super().__init__(spec.name)
        self.__spec__ = spec
        self.__file__ = spec.origin
        self.__path__ = list(spec.submodule_search_locations or [])
        self.is_valid_syntax = is_valid_syntax

    def __getattr__(self, attribute: str) -> Any:
        return getattr(load(), attribute)

    def __dir__(self) -> list[str]:
        return dir(load())


def load() -> types.ModuleType:
    """The real ``rfc3987_syntax``, imported now if only the stand-in is there.

    Raises:
        ImportError: the real module cannot be imported.
    Costs about 0.7 s the first time (its parser), a dictionary lookup after.
    """
    module = sys.modules.get(NAME)
    if module is not None and not isinstance(module, DeferredModule):
        return module  # the common case after the first call: no lock
    with _LOCK:
        module = sys.modules.get(NAME)
        if module is None or isinstance(module, DeferredModule):
            sys.modules.pop(NAME, None)
            module = importlib.import_module(NAME)
        return module


def is_valid_syntax(term: str, value: str) -> bool:
    """``rfc3987_syntax.is_valid_syntax``, from the real module (imported on the first call).

    Raises:
        ImportError: the real module cannot be imported.
        ValueError: ``term`` is not one of RFC 3987's rules (as the real function).
    Costs :func:`load` and the real check.
    """
    return bool(load().is_valid_syntax(term, value))


def defer() -> bool:
    """Put the stand-in in ``sys.modules``; ``False`` when there is nothing to defer (the
    real module or ``jsonschema`` already imported, or it or ``lark`` not installed).
    Costs two module searches on ``sys.path`` (well under a millisecond)."""
    if NAME in sys.modules or "jsonschema" in sys.modules:
        return False
    try:
        spec = importlib.util.find_spec(NAME)
        has_lark = importlib.util.find_spec("lark") is not None
    except (ImportError, ValueError):
        return False
    if spec is None or not has_lark:
        return False
    sys.modules[NAME] = DeferredModule(spec)
    return True


DEFERRED = defer()
