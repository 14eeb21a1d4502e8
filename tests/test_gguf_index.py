"""The GGUF index: the first load parses the file with ``gguf.GGUFReader`` and caches what
the loader reads; later loads give the reader's tensors (names, kinds, shapes, the same
arrays) without parsing the file again, and a changed file is parsed anew."""

from __future__ import annotations

import os

import gguf
import numpy as np
import pytest

from octavo.model_executor import gguf_index
from octavo.model_executor.gguf_index import read_index


def write_file(path, rows: int = 4) -> None:
    rng = np.random.default_rng(rows)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_context_length(64)
    writer.add_token_list([f"token{i}" for i in range(300)])  # an array field: not indexed
    weight = rng.standard_normal((rows, 64)).astype(np.float32)
    writer.add_tensor("token_embd.weight", weight)
    writer.add_tensor("output_norm.weight", weight[0].astype(np.float16))
    q8 = gguf.quants.quantize(weight, gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("output.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def assert_same_as_reader(index, path) -> None:
    reader = gguf.GGUFReader(path)
    assert [t.name for t in index.tensors] == [t.name for t in reader.tensors]
    for ours, theirs in zip(index.tensors, reader.tensors, strict=True):
        assert ours.tensor_type == theirs.tensor_type
        assert ours.shape.tolist() == theirs.shape.tolist()
        assert ours.data.dtype == theirs.data.dtype and ours.data.shape == theirs.data.shape
        assert np.array_equal(ours.data, theirs.data)


def test_the_index_gives_the_readers_tensors_and_is_read_from_the_cache(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("OCTAVO_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "model.gguf"
    write_file(path)
    first = read_index(path)
    assert first.fields["general.architecture"] == "llama"
    assert first.fields["llama.block_count"] == 2
    assert "tokenizer.ggml.tokens" not in first.fields
    assert_same_as_reader(first, path)
    assert len(list((tmp_path / "cache" / "gguf-index").glob("*.json"))) == 1

    def refuse(*args, **kwargs):
        raise AssertionError("parsed again")

    monkeypatch.setattr(gguf, "GGUFReader", refuse)
    again = read_index(path)
    assert again.fields == first.fields
    for ours, first_tensor in zip(again.tensors, first.tensors, strict=True):
        assert np.array_equal(ours.data, first_tensor.data)


def test_a_changed_file_is_parsed_again(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("OCTAVO_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "model.gguf"
    write_file(path, rows=4)
    assert read_index(path).tensors[0].data.shape == (4, 64)
    write_file(path, rows=8)
    os.utime(path, ns=(1, 1))  # a new size and time: a new key
    index = read_index(path)
    assert index.tensors[0].data.shape == (8, 64)
    assert_same_as_reader(index, path)


def test_a_cache_that_cannot_be_written_only_costs_the_parse(tmp_path, monkeypatch) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("OCTAVO_CACHE", str(blocker))
    path = tmp_path / "model.gguf"
    write_file(path)
    assert_same_as_reader(read_index(path), path)


def test_an_index_past_the_end_of_the_file_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("OCTAVO_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "model.gguf"
    write_file(path)
    record = gguf_index._parsed_record(path)
    record["tensors"][-1]["offset"] = path.stat().st_size
    with pytest.raises(ValueError, match="ends past the file"):
        gguf_index._from_record(record, path)
