"""The native kernel's sources ship with the package and rebuild it when they change: every
header and include of ``src/formline/native`` is in pyproject's package data (an sdist
without one cannot compile the kernel) and in setup.py's ``KERNEL_HEADERS`` (the
extension's ``depends``: an edit to a header not listed leaves a stale build), and so is
every ``.pxd`` of the packages compiled by Cython."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NATIVE = ROOT / "src" / "formline" / "native"


def kernel_sources() -> set[str]:
    return {path.name for path in NATIVE.iterdir() if path.suffix in {".hpp", ".pxi"}}


def setup_kernel_headers() -> set[str]:
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "KERNEL_HEADERS"
            for target in node.targets
        ):
            return set(ast.literal_eval(node.value))
    raise AssertionError("setup.py has no KERNEL_HEADERS")


def test_every_kernel_source_is_package_data() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    shipped = set(pyproject["tool"]["setuptools"]["package-data"]["formline.native"])
    assert kernel_sources() | {"_kernel.pyx", "_kernel.pyi"} <= shipped
    assert {name for name in shipped if not (NATIVE / name).exists()} == set()


def test_every_kernel_source_rebuilds_the_extension() -> None:
    assert kernel_sources() == setup_kernel_headers()


def test_every_declarations_file_of_the_compiled_packages_is_package_data() -> None:
    # A module's build is named by the digest of its .py and .pxd: an installed wheel without
    # the .pxd would run that module from source, warning StaleCompiledModule.
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    package_data = pyproject["tool"]["setuptools"]["package-data"]
    for package in ("grammar", "schema"):
        declared = {path.name for path in (ROOT / "src" / "formline" / package).glob("*.pxd")}
        assert declared <= set(package_data.get(f"formline.{package}", [])), package
    assert "nodes.pxd" in package_data["formline.grammar"]
