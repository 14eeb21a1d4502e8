"""A GGUF file's header, parsed once by the ``gguf`` package and kept as a small index.

``gguf.GGUFReader`` parses every metadata field in Python, the vocabulary and its merges
included: 3.7 s of CPU on each load of the embedded SmolLM2 file (49k tokens), though the
loader only reads a few plain fields and where each tensor lies. The first load of a file
parses it with the package and writes those down (``$OCTAVO_CACHE/gguf-index/``, one JSON
file per file path, size and modification time); later loads memory-map the file and take
the tensors from the index, as the same arrays the reader gives (dtype, shape, offset).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from octavo.cache_dirs import cache_root

logger = logging.getLogger(__name__)

INDEX_VERSION = 1
FieldValue = int | float | bool | str


@dataclass(frozen=True)
class IndexedTensor:
    """What the loader reads of a ``gguf.ReaderTensor``."""

    name: str
    tensor_type: object  # gguf.GGMLQuantizationType
    shape: np.ndarray  # the dimensions as the file lists them (innermost first)
    data: np.ndarray  # over the memory-mapped file: the reader's dtype and shape


@dataclass(frozen=True)
class GgufIndex:
    """The plain (not array) metadata fields and the tensors of one GGUF file."""

    fields: dict[str, FieldValue]
    tensors: list[IndexedTensor]


def read_index(path: Path) -> GgufIndex:
    """The index of the GGUF file at PATH: from the cache, else parsed and cached."""
    stat = path.stat()
    key = f"{INDEX_VERSION}|{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    cached = cache_root() / "gguf-index" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"
    try:
        return _from_record(json.loads(cached.read_text()), path)
    except (OSError, ValueError, KeyError):
        pass  # not cached yet (or unreadable): parse it
    record = _parsed_record(path)
    _write_atomically(cached, json.dumps(record))
    return _from_record(record, path)


def _parsed_record(path: Path) -> dict:
    from gguf import GGUFReader, GGUFValueType

    reader = GGUFReader(path)
    fields = {
        name: field.contents()
        for name, field in reader.fields.items()
        if field.types and field.types[0] != GGUFValueType.ARRAY
    }
    tensors = [
        {
            "name": tensor.name,
            "type": int(tensor.tensor_type),
            "shape": [int(d) for d in tensor.shape],
            "offset": int(tensor.data_offset),
            "dtype": tensor.data.dtype.str,
            "data_shape": [int(d) for d in tensor.data.shape],
        }
        for tensor in reader.tensors
    ]
    return {"fields": fields, "tensors": tensors}


def _from_record(record: dict, path: Path) -> GgufIndex:
    from gguf import GGMLQuantizationType

    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    tensors = []
    for entry in record["tensors"]:
        dtype, data_shape = np.dtype(entry["dtype"]), tuple(entry["data_shape"])
        size = int(np.prod(data_shape, dtype=np.int64)) * dtype.itemsize
        start = entry["offset"]
        if start + size > mapped.size:
            raise ValueError(f"{path.name}: tensor {entry['name']} ends past the file")
        data = mapped[start : start + size].view(dtype).reshape(data_shape)
        kind = GGMLQuantizationType(entry["type"])
        shape = np.array(entry["shape"], dtype=np.uint64)
        tensors.append(IndexedTensor(entry["name"], kind, shape, data))
    return GgufIndex(dict(record["fields"]), tensors)


def _write_atomically(target: Path, text: str) -> None:
    """Written beside TARGET and renamed into place; a cache that cannot be written is
    only logged (the next load parses the file again)."""
    staging = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, staging = tempfile.mkstemp(prefix=f".{target.name}-", dir=target.parent)
        with os.fdopen(handle, "w") as stream:
            stream.write(text)
        os.replace(staging, target)
    except OSError as error:
        logger.info("GGUF index not cached (%s): the next load parses the file again", error)
        if staging is not None:
            Path(staging).unlink(missing_ok=True)
