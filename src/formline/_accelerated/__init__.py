"""Loads the schema compiler's modules compiled by Cython, when they match their source.

``setup.py`` compiles each module of ``formline.schema`` and ``formline.grammar`` unchanged
(plain Python to Cython: the schema-to-IR step is about 100,000 small Python calls for a
30 kB schema, and compiled it takes a third less time; ``bench.ttfm_stages`` measures it).
The built file is not put beside its ``.py`` (Python's import prefers an extension module
there, so an edit of the source would silently do nothing) but here, as
``<package>/<module>_<digest>.<suffix>``, where ``<digest>`` is the first 16 hex digits of the
SHA-256 of the source it was compiled from, with the Cython declarations beside it if any
(``grammar/nodes.pxd`` makes the IR's node classes C types).

Importing this package puts :class:`CompiledModuleFinder` first on ``sys.meta_path``. It serves
``formline.schema.compiler`` and the others from their compiled file only when the digest of
the ``.py`` (and ``.pxd``) beside them now equals the file's; otherwise the Python source
runs, with a :class:`StaleCompiledModule` warning when a compiled file of another version of
the source is present (run ``pip install -e .`` again; under ``-W error`` that warning fails
the import).
``FORMLINE_PURE_PYTHON=1`` turns the finder off: everything runs from source (the
differential tests compare the two). Costs one SHA-256 of each compiled module's source at its
import (about 0.3 ms in all).

Compiled code does not count Python's recursion depth (a call between two compiled functions
does not check the limit), so no ``RecursionError`` stops a runaway recursion there: every
recursion in these packages is capped explicitly (``SchemaOptions.max_depth``, the regex and
EBNF parsers' ``MAX_GROUP_DEPTH``, ``CHAIN_CUT``), and the hostile-input tests run compiled.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # the formline package's folder
EXTENSION_SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]
DIGEST_DIGITS = 16


class StaleCompiledModule(UserWarning):
    """A compiled module was built from another version of its source; the source runs."""


def source_digest(path: Path) -> str:
    """The first 16 hex digits of the SHA-256 of a module's source and of the Cython
    declarations beside it (``nodes.pxd`` makes ``nodes.py``'s classes C types), if any: what
    ``setup.py`` names builds by, so an edit of either makes the build stale.

    Raises:
        OSError: the source cannot be read.
    """
    digest = hashlib.sha256(path.read_bytes())
    declarations = path.with_suffix(".pxd")
    if declarations.exists():
        digest.update(b"\0" + declarations.read_bytes())
    return digest.hexdigest()[:DIGEST_DIGITS]


class CompiledModuleFinder(importlib.abc.MetaPathFinder):
    """Finds ``formline.<package>.<module>`` in ``compiled_root/<package>/``, built from the
    current ``package_root/<package>/<module>.py`` (and its ``.pxd``, if any). Lists
    ``compiled_root`` once."""

    def __init__(self, package_root: Path, compiled_root: Path) -> None:
        self.package_root = package_root
        self.candidates: dict[str, list[Path]] = {}
        for path in sorted(compiled_root.glob(f"*/*{EXTENSION_SUFFIX}")):
            stem, _, digest = path.name.removesuffix(EXTENSION_SUFFIX).rpartition("_")
            if stem and len(digest) == DIGEST_DIGITS:
                name = f"formline.{path.parent.name}.{stem}"
                self.candidates.setdefault(name, []).append(path)

    def compiled_path(self, fullname: str) -> Path | None:
        """The compiled file of module ``fullname`` built from its current source, or
        ``None`` (warning :class:`StaleCompiledModule` when only builds of other versions
        exist). Costs a SHA-256 of the source when a build of the module exists."""
        candidates = self.candidates.get(fullname)
        if not candidates:
            return None
        source = self.package_root.joinpath(*fullname.split(".")[1:]).with_suffix(".py")
        try:
            digest = source_digest(source)
        except OSError:
            return None
        for path in candidates:
            if path.name.endswith(f"_{digest}{EXTENSION_SUFFIX}"):
                return path
        warnings.warn(
            f"{fullname} runs from its Python source: its compiled module was built from "
            f"another version of {source.name} (pip install -e . compiles it again)",
            StaleCompiledModule,
            stacklevel=2,
        )
        return None

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        """The import system's question: a spec loading the compiled file, or ``None`` for
        the next finder (the source). Costs :meth:`compiled_path`."""
        compiled = self.compiled_path(fullname)
        if compiled is None:
            return None  # the next finder loads the source
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(compiled))
        return importlib.util.spec_from_file_location(fullname, compiled, loader=loader)


def is_compiled(module: ModuleType) -> bool:
    """Whether ``module`` runs from a compiled file (not from its ``.py``)."""
    return str(getattr(module, "__file__", "")).endswith(EXTENSION_SUFFIX)


def install() -> CompiledModuleFinder | None:
    """Put the finder first on ``sys.meta_path`` (once), unless ``FORMLINE_PURE_PYTHON=1``."""
    if os.environ.get("FORMLINE_PURE_PYTHON") == "1":
        return None
    for finder in sys.meta_path:
        if isinstance(finder, CompiledModuleFinder):
            return finder
    finder = CompiledModuleFinder(PACKAGE_ROOT, Path(__file__).resolve().parent)
    sys.meta_path.insert(0, finder)
    return finder


FINDER = install()
