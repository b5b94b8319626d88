"""The GGUF export's cache (for vLLM): keyed by the file itself, not its name alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from formline.backends.base import BackendError
from formline.backends.export import MARKER, _directory_name, exported_model_directory


def test_a_missing_file_is_an_error_not_another_files_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORMLINE_CACHE_DIR", str(tmp_path / "cache"))
    first, second = tmp_path / "a" / "model.gguf", tmp_path / "b" / "model.gguf"
    for path, content in ((first, b"one"), (second, b"other")):
        path.parent.mkdir()
        path.write_bytes(content)
    exported = tmp_path / "cache" / "models" / _directory_name(first, "bfloat16")
    exported.mkdir(parents=True)
    (exported / MARKER).write_text("exported\n")  # as a finished export leaves it
    assert exported_model_directory(first) == exported
    # Same name and dtype: it was answered with the first file's export.
    assert _directory_name(second, "bfloat16") != exported.name
    with pytest.raises(BackendError, match="no GGUF model file"):
        exported_model_directory(tmp_path / "missing" / "model.gguf")
