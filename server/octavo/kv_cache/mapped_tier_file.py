"""File-backed host tensors for the KV offload tier of a CPU deployment.

On a CPU the KV cache already lives in RAM, so a tier in anonymous memory would only
compete with it. There the tier's blocks live in one shared memory mapping of a fresh
file instead (vLLM's ``fs`` tier plays that part behind its CPU tier): the kernel writes
the pages back to disk and drops the ones not recently used, so the tier can be larger
than the memory left over. The file is made under ``<cache root>/kv-offload``
(``$OCTAVO_CACHE`` moves it), its space reserved up front so a full disk is a clear
error at start-up rather than a bus error mid-run, and unlinked as soon as it is mapped:
nothing is left behind at exit, even after a crash.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import torch

from octavo.cache_dirs import cache_root

PAGE = 4096  # each layer's tensor starts on a page of its own


def tier_directory() -> Path:
    """Where the tier's file is made (created when missing)."""
    directory = cache_root() / "kv-offload"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def file_backed_zeros(
    shapes: list[tuple[int, ...]], dtypes: list[torch.dtype], directory: Path | None = None
) -> list[torch.Tensor]:
    """Zeroed tensors of ``shapes``/``dtypes``, all views of one unlinked mapped file."""
    sizes = [
        math.prod(s) * torch.empty((), dtype=d).element_size()
        for s, d in zip(shapes, dtypes, strict=True)
    ]
    offsets, total = _page_offsets(sizes)
    mapping = _map_fresh_file(directory or tier_directory(), max(total, PAGE))
    return [
        mapping[offset : offset + size].view(dtype).view(shape)
        for offset, size, shape, dtype in zip(offsets, sizes, shapes, dtypes, strict=True)
    ]


def _page_offsets(sizes: list[int]) -> tuple[list[int], int]:
    offsets, end = [], 0
    for size in sizes:
        offsets.append(end)
        end += -(-size // PAGE) * PAGE
    return offsets, end


def _map_fresh_file(directory: Path, num_bytes: int) -> torch.Tensor:
    """``num_bytes`` of a new file in ``directory``, mapped shared as uint8, then unlinked."""
    fd, path = tempfile.mkstemp(prefix="kv-tier-", suffix=".bin", dir=directory)
    try:
        try:
            os.posix_fallocate(fd, 0, num_bytes)  # sparse files would fault on a full disk
        except OSError as error:
            raise ValueError(
                f"cannot reserve {num_bytes / (1 << 30):.2f} GiB for the KV offload tier in "
                f"{directory} ({error.strerror}): lower --kv-offloading-size or set "
                "OCTAVO_CACHE to a larger disk"
            ) from error
        return torch.from_file(path, shared=True, size=num_bytes, dtype=torch.uint8)
    finally:
        os.close(fd)
        os.unlink(path)
