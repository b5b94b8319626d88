"""Builds formline's compiled parts with the package: the mask kernel and the schema compiler.

Everything else is declared in pyproject.toml; ``pip install -e .`` and ``pip install .``
compile them from source (g++ and the Python headers; Cython comes from PyPI as a build
dependency). Nothing downloads a prebuilt binary.

1. ``formline.native._kernel``: the mask kernel, C++ behind Cython.
2. The modules of ``formline.schema`` and ``formline.grammar``, compiled unchanged by Cython:
   the schema-to-IR step is many small Python calls (about 100,000 for a 30 kB schema), and
   compiled they take a third less time (``bench.ttfm_stages``). Each one is written under
   ``formline/_accelerated/`` with the SHA-256 of the source it came from in its file name,
   never beside its ``.py``: there it would shadow every later edit of the source. At import,
   ``formline._accelerated`` loads a compiled module only when its source is unchanged.
"""

import hashlib
import os
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
    "automaton.hpp",
    "thompson.hpp",
    "trie.hpp",
    "equivalence.hpp",
    "walk.hpp",
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
    """The first 16 hex digits of the file's SHA-256 (``formline._accelerated`` reads it)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def accelerated_modules() -> list[Extension]:
    """Each schema/grammar module as an extension named by its own module name, so that its
    classes and functions keep their ``__module__`` (pickling, reprs)."""
    modules = []
    for package in ACCELERATED_PACKAGES:
        for path in sorted((SOURCE / "formline" / package).glob("*.py")):
            if path.name == "__init__.py":
                continue
            modules.append(
                Extension(
                    f"formline.{package}.{path.stem}",
                    sources=[str(path)],
                    extra_compile_args=["-O2", "-g0"],
                )
            )
    return modules


def placed_under_accelerated(extensions: list[Extension]) -> list[Extension]:
    """The C files are generated for the modules' own names; the extensions are renamed
    only to decide where the built file goes: ``formline/_accelerated/schema/
    objects_<digest>.<suffix>``. Its init function stays ``PyInit_objects``, which is what
    an import of ``formline.schema.objects`` looks for."""
    for extension in extensions:
        package, _, stem = extension.name.removeprefix("formline.").rpartition(".")
        digest = source_digest(SOURCE / "formline" / package / f"{stem}.py")
        extension.name = f"formline._accelerated.{package}.{stem}_{digest}"
        (SOURCE / "formline" / "_accelerated" / package).mkdir(parents=True, exist_ok=True)
    return extensions


class BuildExtensions(build_ext):
    """Both cores build the modules (about 40 s instead of 75 on 2 cores), and the compiled
    copies of earlier sources are removed from the source tree when built in place."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1

    def run(self) -> None:
        if self.inplace or self.editable_mode:
            current = {extension.name.rpartition(".")[2] for extension in self.extensions}
            for path in (SOURCE / "formline" / "_accelerated").glob("*/*.so"):
                if path.name.split(".")[0] not in current:
                    path.unlink()
        super().run()


setup(
    ext_modules=[
        *cythonize([KERNEL], compiler_directives={"language_level": "3"}),
        *placed_under_accelerated(
            cythonize(
                accelerated_modules(),
                compiler_directives=ACCELERATED_DIRECTIVES,
                build_dir="build/accelerated",
                quiet=True,
            )
        ),
    ],
    cmdclass={"build_ext": BuildExtensions},
)
