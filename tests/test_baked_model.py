"""The embedded model's lookup: baked read-only folders first, then the cache; and
``octavo prepare-model``, which bakes it (the conversion itself is faked here: the real
one runs in tests/test_image.py and conftest's ``smol_folder``)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from octavo.cli import main
from octavo.model_executor import embedded
from octavo.model_executor.embedded import (
    BAKED_MODELS_ENV,
    EMBEDDED_MODEL_NAME,
    embedded_model_folder,
    prepare_embedded_model,
)


def fake_model(models_dir: Path, complete: bool = True) -> Path:
    folder = models_dir / EMBEDDED_MODEL_NAME
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    if complete:
        (folder / "model.safetensors").write_bytes(b"")
    return folder


@pytest.fixture
def cache(monkeypatch, tmp_path) -> Path:
    folder = tmp_path / "cache"
    folder.mkdir()
    monkeypatch.setenv("OCTAVO_CACHE", str(folder))
    monkeypatch.delenv(BAKED_MODELS_ENV, raising=False)
    return folder


@pytest.fixture
def no_conversion(monkeypatch):
    def refuse(source: Path, out: Path) -> None:
        raise AssertionError(f"converted {source} into {out}")

    monkeypatch.setattr(embedded, "_convert", refuse)


def test_baked_folder_wins_and_the_cache_stays_empty(cache, tmp_path, monkeypatch, no_conversion):
    baked = fake_model(tmp_path / "baked")
    monkeypatch.setenv(BAKED_MODELS_ENV, str(tmp_path / "baked"))
    assert embedded_model_folder() == baked
    assert not any(cache.iterdir())


def test_baked_search_path_skips_missing_and_incomplete_folders(
    cache, tmp_path, monkeypatch, no_conversion
):
    fake_model(tmp_path / "incomplete", complete=False)
    good = fake_model(tmp_path / "good")
    roots = [tmp_path / "missing", tmp_path / "incomplete", tmp_path / "good"]
    monkeypatch.setenv(BAKED_MODELS_ENV, os.pathsep.join(map(str, roots)))
    assert embedded_model_folder() == good


def test_without_a_baked_copy_the_cached_copy_is_used(cache, tmp_path, monkeypatch, no_conversion):
    fake_model(tmp_path / "baked", complete=False)
    monkeypatch.setenv(BAKED_MODELS_ENV, str(tmp_path / "baked"))
    cached = fake_model(cache / "models")
    assert embedded_model_folder() == cached


def test_conversion_result_is_readable_by_every_uid(tmp_path, monkeypatch):
    def private_files(source: Path, out: Path) -> None:
        for name in ("config.json", "model.safetensors"):
            (out / name).write_text("x")
            (out / name).chmod(0o600)

    monkeypatch.setattr(embedded, "_convert", private_files)
    monkeypatch.setattr(embedded, "gguf_path", lambda: tmp_path / "model.gguf")
    target = prepare_embedded_model(tmp_path / "models")
    assert target == tmp_path / "models" / EMBEDDED_MODEL_NAME
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    for path in target.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path
    assert [p.name for p in (tmp_path / "models").iterdir()] == [EMBEDDED_MODEL_NAME]


def test_prepare_model_cli_into_a_folder(cache, tmp_path, capsys, no_conversion):
    existing = fake_model(tmp_path / "into")
    assert main(["prepare-model", "--into", str(tmp_path / "into")]) == 0
    assert capsys.readouterr().out.strip() == str(existing)


def test_baking_copies_the_caches_converted_copy(cache, tmp_path, monkeypatch, no_conversion):
    cached = fake_model(cache / "models")
    (cached / "model.safetensors").write_bytes(b"weights")
    (cached / "model.safetensors").chmod(0o600)
    monkeypatch.setattr(embedded, "gguf_path", lambda: tmp_path / "model.gguf")
    target = prepare_embedded_model(tmp_path / "baked")
    assert (target / "model.safetensors").read_bytes() == b"weights"
    assert stat.S_IMODE((target / "model.safetensors").stat().st_mode) == 0o644
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.safetensors"]


def test_prepare_model_cli_defaults_to_the_cache(cache, capsys, no_conversion):
    existing = fake_model(cache / "models")
    assert main(["prepare-model"]) == 0
    assert capsys.readouterr().out.strip() == str(existing.resolve())
