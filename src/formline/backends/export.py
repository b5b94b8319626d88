"""A GGUF model as a Hugging Face safetensors directory, once, cached (for vLLM).

vLLM loads Hugging Face directories; the embedded SmolLM2 ships as a Q4_1 GGUF. transformers
reads the GGUF (``gguf_file=``, dequantized) and ``save_pretrained`` writes config, tokenizer
and safetensors weights. The directory is written next to a temporary name and renamed when
complete, so a run killed half-way leaves no half directory behind.

Run ``python -m formline.backends.export [GGUF] [--dtype bfloat16]``: prints the directory.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
from pathlib import Path
from typing import Any

from formline.backends.base import BackendError, default_model_path
from formline.vocab.fixtures import cache_directory

MARKER = "formline-export.txt"  # written last: its presence means the export is complete


def exported_model_directory(gguf: Path | None = None, dtype: str = "bfloat16") -> Path:
    """The cached Hugging Face directory of ``gguf`` (default: the embedded SmolLM2) in
    ``dtype``, exported the first time.

    Raises:
        BackendError: transformers, gguf or accelerate is missing, or the export fails.
    Costs, the first time, one transformers load and save (about 20 s and 270 MB on disk
    for SmolLM2-135M in bfloat16); afterwards one ``stat``.
    """
    source = Path(gguf) if gguf is not None else default_model_path()
    if not source.is_file():
        raise BackendError(f"no GGUF model file at {source}")
    target = cache_directory() / "models" / _directory_name(source, dtype)
    if (target / MARKER).is_file():
        return target
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as error:
        raise BackendError(
            f"exporting a GGUF needs transformers, torch, gguf and accelerate: {error}"
        ) from error
    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise BackendError(f"unknown dtype {dtype!r}: use e.g. 'float32' or 'bfloat16'")
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    options: dict[str, Any] = {"gguf_file": source.name, "local_files_only": True}
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(source.parent), **options)
        model = AutoModelForCausalLM.from_pretrained(
            str(source.parent), dtype=torch_dtype, **options, **_dequantized(source)
        )
        model.save_pretrained(str(partial), safe_serialization=True)
        tokenizer.save_pretrained(str(partial))
    except (OSError, ValueError, KeyError, ImportError) as error:
        raise BackendError(f"cannot export {source}: {error}") from error
    (partial / MARKER).write_text(f"exported from {source} as {dtype}\n")
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return target


def _directory_name(source: Path, dtype: str) -> str:
    """The export's directory name: the file's name and ``dtype``, and a digest of its
    resolved path, size and modification time (keyed by name and dtype alone, another
    ``model.gguf``, or a missing one, was answered with the first one's export)."""
    status = source.stat()
    identity = f"{source.resolve()}\0{status.st_size}\0{status.st_mtime_ns}"
    digest = hashlib.sha256(identity.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return f"{source.name.removesuffix('.gguf')}-{dtype}-{digest}"


def _dequantized(source: Path) -> dict[str, Any]:
    """Loading options for dense weights: transformers from 5.2x keeps a GGUF's blocks packed
    (and then refuses to save them) unless told to dequantize; older releases always did."""
    try:
        from transformers import GgufConfig
    except ImportError:
        return {}
    return {"quantization_config": GgufConfig(gguf_file=source.name, dequantize=True)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", nargs="?", help="a GGUF file (default: the embedded SmolLM2)")
    parser.add_argument("--dtype", default="bfloat16")
    arguments = parser.parse_args(argv)
    try:
        gguf = Path(arguments.gguf) if arguments.gguf else None
        print(exported_model_directory(gguf, arguments.dtype))
    except BackendError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
