"""Builds formline's compiled mask kernel (C++ behind Cython) with the package.

Everything else is declared in pyproject.toml; ``pip install -e .`` and ``pip install .``
compile ``formline.native._kernel`` from source (g++ and the Python headers; Cython comes
from PyPI as a build dependency). Nothing downloads a prebuilt binary.
"""

from Cython.Build import cythonize
from setuptools import Extension, setup

KERNEL = Extension(
    "formline.native._kernel",
    sources=["src/formline/native/_kernel.pyx"],
    include_dirs=["src/formline/native"],
    depends=[
        "src/formline/native/apply.hpp",
        "src/formline/native/batch.hpp",
        "src/formline/native/pool.hpp",
        "src/formline/native/dfa.hpp",
        "src/formline/native/kernel.hpp",
        "src/formline/native/hopcroft.hpp",
        "src/formline/native/lazy_build.hpp",
        "src/formline/native/automaton.hpp",
        "src/formline/native/thompson.hpp",
        "src/formline/native/trie.hpp",
        "src/formline/native/equivalence.hpp",
        "src/formline/native/walk.hpp",
    ],
    language="c++",
    extra_compile_args=["-std=c++17", "-O3"],
)

setup(ext_modules=cythonize([KERNEL], compiler_directives={"language_level": "3"}))
