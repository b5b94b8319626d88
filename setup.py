"""Builds formline's compiled parts with the package: the mask kernel and the schema compiler.

Everything else is declared in pyproject.toml; ``pip install -e .`` and ``pip install .``
compile them from source (g++ and the Python headers; Cython comes from PyPI as a build
dependency). Nothing downloads a prebuilt binary.

1. ``formline.native._kernel``: the mask kernel, C++ behind Cython.
2. The modules of ``formline.schema`` and ``formline.grammar``, compiled unchanged by Cython:
   the schema-to-IR step is many small Python calls (about 100,000 for a 30 kB schema), and
   compiled they take a third less time (``bench.ttfm_stages``). A ``.pxd`` beside a module
   declares its classes as C types (``grammar/nodes.pxd``: the IR's nodes; the slowest
   tenth's schema-to-IR step 2.41 -> 2.01 ms in ``bench.ttfm_stages``, means of four runs).
   Each one is written under ``formline/_accelerated/`` with the SHA-256 of the source it came
   from in its file name, never beside its ``.py``: there it would shadow every later edit of
   the source. At import, ``formline._accelerated`` loads a compiled module only when its
   source is unchanged.
"""

import hashlib
import os
import sysconfig
from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SOURCE = Path("src")
KERNEL_HEADERS = (
    "apply.hpp",
    "batch.hpp",
    "pool.hpp",
    "dfa.hpp",
    "kernel.hpp",
    "hopcroft.hpp",
    "lazy_build.hpp",
    "ir_facts.hpp",
    "rule_graph.hpp",
    "automaton.hpp",
    "thompson.hpp",
    "trie.hpp",
    "equivalence.hpp",
    "flat_index.hpp",
    "walk.hpp",
    "spin_mutex.hpp",
    "matcher_core.pxi",
)
KERNEL = Extension(
    "formline.native._kernel",
    sources=["src/formline/native/_kernel.pyx"],
    include_dirs=["src/formline/native"],
    depends=[f"src/formline/native/{header}" for header in KERNEL_HEADERS],
    language="c++",
    extra_compile_args=["-std=c++17", "-O3"],
)
ACCELERATED_PACKAGES = ("schema", "grammar")
# Compiled as plain Python: annotations are not read as C types (an ``int`` annotation
# would make Cython refuse a NumPy integer where Python takes it).
ACCELERATED_DIRECTIVES = {"language_level": "3", "annotation_typing": False, "binding": True}


def source_digest(path: Path) -> str:
    """The first 16 hex digits of the SHA-256 of the module's source and of the ``.pxd``
    beside it, if any (``formline._accelerated.source_digest`` computes the same)."""
    digest = hashlib.sha256(path.read_bytes())
    declarations = path.with_suffix(".pxd")
    if declarations.exists():
        digest.update(b"\0" + declarations.read_bytes())
    return digest.hexdigest()[:16]


def accelerated_module(path: Path) -> Extension:
    """One schema/grammar module, Cython's C generated for its own module name (so that its
    classes and functions keep their ``__module__``, and its init function is the
    ``PyInit_<module>`` that an import of it looks for), then renamed only to decide where
    the built file goes: ``formline/_accelerated/schema/objects_<digest>.<suffix>``.

    The C goes to a folder named by the same digest: Cython regenerates a C file only when
    its source's modification time is newer, and a source copied with its old time (``cp
    -p``, an archive, a container layer) would otherwise be built from the old C under the
    new digest, and loaded as current."""
    package = path.parent.name
    digest = source_digest(path)
    (extension,) = cythonize(
        Extension(
            f"formline.{package}.{path.stem}", [str(path)], extra_compile_args=["-O2", "-g0"]
        ),
        compiler_directives=ACCELERATED_DIRECTIVES,
        build_dir=f"build/accelerated/{digest}",
        quiet=True,
    )
    extension.name = f"formline._accelerated.{package}.{path.stem}_{digest}"
    # Without Cython's output the package still works, from source (the tests say so).
    extension.optional = True
    (SOURCE / "formline" / "_accelerated" / package).mkdir(parents=True, exist_ok=True)
    return extension


def accelerated_modules() -> list[Extension]:
    """Every module of the accelerated packages but their ``__init__``."""
    return [
        accelerated_module(path)
        for package in ACCELERATED_PACKAGES
        for path in sorted((SOURCE / "formline" / package).glob("*.py"))
        if path.name != "__init__.py"
    ]


class BuildExtensions(build_ext):
    """The modules are built on every CPU this process may use (about 40 s instead of 75 on
    2 cores), and the builds of earlier sources are removed, in the source tree (in place)
    and in the build folder (a wheel would carry them)."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:
            self.parallel = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1

    def run(self) -> None:
        current = {extension.name.rpartition(".")[2] for extension in self.extensions}
        for root in (SOURCE / "formline", Path(self.build_lib) / "formline"):
            for path in (root / "_accelerated").glob(
                f"*/*{sysconfig.get_config_var('EXT_SUFFIX')}"
            ):
                if path.name.split(".")[0] not in current:
                    path.unlink()
        super().run()


setup(
    ext_modules=[
        *cythonize([KERNEL], compiler_directives={"language_level": "3"}),
        *accelerated_modules(),
    ],
    cmdclass={"build_ext": BuildExtensions},
)
