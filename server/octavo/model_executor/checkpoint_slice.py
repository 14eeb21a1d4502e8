"""A checkpoint tensor read lazily: a tensor-parallel rank reads only its slice of it.

``safetensors`` can read part of a tensor (``get_slice``) without loading the rest, so a
rank holding half of a matrix reads half of it from disk and never holds the whole. The
layers' weight loaders call ``narrow`` (as on a tensor) or ``full`` for unsplit weights.
"""

from __future__ import annotations

import torch


class CheckpointSlice:
    def __init__(self, handle) -> None:  # a safetensors PySafeSlice
        self._handle = handle
        self.shape = torch.Size(handle.get_shape())

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        index = [slice(None)] * dim + [slice(start, start + length)]
        return self._handle[tuple(index)]

    def full(self) -> torch.Tensor:
        return self._handle[:]


class RowRange:
    """Rows ``[start, start + rows)`` of a checkpoint tensor, still read lazily (one matrix
    of a checkpoint that stores several fused, e.g. Phi-3's ``qkv_proj``)."""

    def __init__(self, source, start: int, rows: int) -> None:
        self.source, self.start = source, start
        self.shape = torch.Size((rows, *source.shape[1:]))

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        if dim == 0:
            return self.source.narrow(0, self.start + start, length)
        return self.full().narrow(dim, start, length)

    def full(self) -> torch.Tensor:
        return self.source.narrow(0, self.start, self.shape[0])


def materialize(tensor) -> torch.Tensor:
    """A plain tensor of a lazily read slice, or of a quantized matrix (dequantized)."""
    if isinstance(tensor, CheckpointSlice | RowRange):
        return tensor.full()
    if hasattr(tensor, "dequantize") and not isinstance(tensor, torch.Tensor):
        return tensor.dequantize()  # e.g. a GGUF embedding feeding a float embedding table
    return tensor
