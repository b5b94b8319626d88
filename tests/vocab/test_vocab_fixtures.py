"""fixture_path and scripts/fetch_fixtures.py (offline: a local sdist stands in for PyPI)."""

from __future__ import annotations

import importlib.util
import io
import pathlib
import sys
import tarfile
from types import ModuleType

import pytest

from formline.vocab.fixtures import FIXTURE_FILES, fixture_path

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "fetch_fixtures.py"


@pytest.fixture(scope="module")
def fetch_script() -> ModuleType:
    specification = importlib.util.spec_from_file_location("fetch_fixtures_under_test", SCRIPT)
    assert specification is not None and specification.loader is not None
    module = importlib.util.module_from_spec(specification)
    sys.modules[specification.name] = module  # dataclasses need the module registered
    specification.loader.exec_module(module)
    return module


def make_sdist(path: pathlib.Path, members: dict[str, bytes]) -> pathlib.Path:
    with tarfile.open(path, "w:gz") as archive:
        for name, content in members.items():
            info = tarfile.TarInfo(f"llama_cpp_python-0.3.36/{name}")
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    return path


class TestFixturePath:
    def test_returns_the_cached_file(
        self, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("FORMLINE_CACHE_DIR", str(tmp_path))
        (tmp_path / "fixtures").mkdir()
        (tmp_path / "fixtures" / "ggml-vocab-qwen2.gguf").write_bytes(b"GGUF")
        assert fixture_path("qwen2") == tmp_path / "fixtures" / "ggml-vocab-qwen2.gguf"

    def test_missing_file_says_how_to_fetch(
        self, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("FORMLINE_CACHE_DIR", str(tmp_path))
        with pytest.raises(FileNotFoundError, match=r"run `python scripts/fetch_fixtures\.py`"):
            fixture_path("smollm2")

    def test_unknown_name(self) -> None:
        with pytest.raises(KeyError, match="unknown fixture 'bert'"):
            fixture_path("bert")

    def test_default_cache_is_under_home(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delenv("FORMLINE_CACHE_DIR", raising=False)
        monkeypatch.setenv("HOME", "/nonexistent-home")
        with pytest.raises(FileNotFoundError, match=r"/nonexistent-home/\.cache/formline/"):
            fixture_path("phi-3")


class TestFetchScript:
    def test_script_and_module_agree_on_file_names(self, fetch_script: ModuleType) -> None:
        assert {name: f.filename for name, f in fetch_script.FIXTURES.items()} == FIXTURE_FILES
        assert all(len(fixture.sha256) == 64 for fixture in fetch_script.FIXTURES.values())

    def test_extracts_from_sdist_and_is_idempotent(
        self,
        fetch_script: ModuleType,
        tmp_path: pathlib.Path,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        real = fixture_path("phi-3").read_bytes()
        sdist = make_sdist(
            tmp_path / "sdist.tar.gz",
            {
                "vendor/llama.cpp/models/ggml-vocab-phi-3.gguf": real,
                "vendor/llama.cpp/models/ggml-vocab-phi-3.gguf.inp": b"ignored",
                "other/ggml-vocab-phi-3.gguf": b"wrong place",
            },
        )
        monkeypatch.setenv("FORMLINE_CACHE_DIR", str(tmp_path / "cache"))
        arguments = ["--only", "phi-3", "--llama-cpp-sdist", str(sdist)]
        assert fetch_script.main(arguments) == 0
        target = tmp_path / "cache" / "fixtures" / "ggml-vocab-phi-3.gguf"
        assert target.read_bytes() == real
        assert "fetched" in capsys.readouterr().out
        assert fetch_script.main(arguments) == 0
        assert "present" in capsys.readouterr().out
        assert sorted(p.name for p in target.parent.iterdir()) == [target.name]

    def test_wrong_content_fails_cleanly(
        self,
        fetch_script: ModuleType,
        tmp_path: pathlib.Path,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        sdist = make_sdist(
            tmp_path / "sdist.tar.gz",
            {"vendor/llama.cpp/models/ggml-vocab-gpt-2.gguf": b"GGUF but not the pinned file"},
        )
        monkeypatch.setenv("FORMLINE_CACHE_DIR", str(tmp_path / "cache"))
        assert fetch_script.main(["--only", "gpt-2", "--llama-cpp-sdist", str(sdist)]) == 1
        assert "gpt-2: extracted ggml-vocab-gpt-2.gguf is not the expected" in (
            capsys.readouterr().err
        )
        assert list((tmp_path / "cache" / "fixtures").iterdir()) == []

    def test_member_missing_from_sdist_is_reported(
        self,
        fetch_script: ModuleType,
        tmp_path: pathlib.Path,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        sdist = make_sdist(tmp_path / "sdist.tar.gz", {"README.md": b"nothing here"})
        monkeypatch.setenv("FORMLINE_CACHE_DIR", str(tmp_path / "cache"))
        assert fetch_script.main(["--only", "qwen2", "--llama-cpp-sdist", str(sdist)]) == 1
        assert "lacks vendor/llama.cpp/models/['ggml-vocab-qwen2.gguf']" in capsys.readouterr().err

    def test_unknown_only_name_is_a_usage_error(self, fetch_script: ModuleType) -> None:
        with pytest.raises(SystemExit) as exit_info:
            fetch_script.main(["--only", "smollm2,bert"])
        assert exit_info.value.code == 2
