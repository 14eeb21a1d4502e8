"""The cached folder a ``.gguf`` file is served from: its config and tokenizer are read once
per header (metadata and tensor table), not once per path.

Tests write many small GGUF files into fresh temporary folders; each used to cost a reading
of its tokenizer (~7 s of CPU for SmolLM2's vocabulary). The reading is replaced here by a
recorder, so what is checked is which files share a description and where each folder's
``model.gguf`` link points.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest

from octavo.model_executor import gguf_folder
from octavo.model_executor.quantized_checkpoint import GGUF_LINK


def write_gguf(path: Path, weight: np.ndarray, layers: int = 2) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(layers)
    writer.add_tensor("token_embd.weight", weight)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def readings(monkeypatch, tmp_path) -> list[Path]:
    """Every file whose config and tokenizer were read (a config naming its layers)."""
    monkeypatch.setenv("OCTAVO_CACHE", str(tmp_path / "cache"))
    read: list[Path] = []

    def record(path: Path, out: Path) -> None:
        read.append(path)
        layers = int(gguf.GGUFReader(path).fields["llama.block_count"].contents())
        (out / "config.json").write_text(json.dumps({"num_hidden_layers": layers}))
        (out / "tokenizer.json").write_text("{}")

    monkeypatch.setattr(gguf_folder, "_write_config_and_tokenizer", record)
    return read


def test_files_with_one_header_are_read_once_and_each_links_its_own_file(readings, tmp_path):
    rng = np.random.default_rng(0)
    first = write_gguf(tmp_path / "a" / "model.gguf", rng.random((4, 8), dtype=np.float32))
    second = write_gguf(tmp_path / "b" / "model.gguf", rng.random((4, 8), dtype=np.float32))
    other = write_gguf(tmp_path / "c" / "model.gguf", rng.random((4, 8), dtype=np.float32), 3)
    folders = [gguf_folder.gguf_model_folder(path) for path in (first, second, other)]
    assert readings == [first, other]  # the second has the first's header: not read again
    assert len(set(folders)) == 3
    for folder, path in zip(folders, (first, second, other), strict=True):
        assert (folder / GGUF_LINK).resolve() == path.resolve()
        assert (folder / "tokenizer.json").is_file()
    assert json.loads((folders[2] / "config.json").read_text()) == {"num_hidden_layers": 3}
    assert gguf_folder.gguf_model_folder(second) == folders[1]  # the path's folder, kept
    assert readings == [first, other]


def test_a_rewritten_file_gets_a_new_folder(readings, tmp_path):
    path = write_gguf(tmp_path / "model.gguf", np.zeros((4, 8), dtype=np.float32))
    before = gguf_folder.gguf_model_folder(path)
    write_gguf(path, np.zeros((4, 16), dtype=np.float32), layers=5)  # another size too
    after = gguf_folder.gguf_model_folder(path)
    assert after != before
    assert json.loads((after / "config.json").read_text()) == {"num_hidden_layers": 5}
    assert readings == [path, path]
