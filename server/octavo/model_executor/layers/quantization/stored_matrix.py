"""A checkpoint matrix kept in the checkpoint's own quantized form (FP8 tiles with their
scales, MXFP4 groups), and the part of it one layer keeps.

Like ``QuantizedTensor`` it answers ``shape`` and ``narrow`` as a tensor does, so the
parallel layers' weight loaders slice it for their rank and a ``QuantizedWeight`` slot
(``PrequantizedLinearMethod``) keeps it as one segment. Its scales cover whole tiles; a
slice that starts inside a tile keeps the tiles it touches and where in the first one it
starts (its phase), so any row or column range can be cut, at any tile size. The torch
path dequantizes the slice into the activations' dtype and runs one float GEMM.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F


class StoredMatrix(ABC):
    """A ``[rows, cols]`` matrix as the checkpoint stores it."""

    @property
    @abstractmethod
    def shape(self) -> torch.Size: ...

    @abstractmethod
    def narrow(self, dim: int, start: int, length: int) -> StoredMatrix: ...

    @abstractmethod
    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The ``[rows, cols]`` matrix in ``dtype``."""

    @abstractmethod
    def tensors(self) -> dict[str, torch.Tensor]:
        """The tensors it keeps, by name (counted as the layer's buffers)."""

    @abstractmethod
    def to(self, device: torch.device) -> StoredMatrix: ...

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W.T`` in ``x``'s dtype: dequantized per call, then one float GEMM."""
        return F.linear(x, self.dequantize(x.dtype))


def covering(phase: int, start: int, length: int, tile: int) -> tuple[int, int, int]:
    """For items ``[start, start + length)`` of a slice whose item 0 sits at ``phase`` in
    its first tile: (first tile, tiles touched, the new phase)."""
    first = phase + start
    end = first + length
    return first // tile, -(-end // tile) - first // tile, first % tile


def expand_tiles(scale: torch.Tensor, tile: int, dim: int, phase: int, size: int) -> torch.Tensor:
    """Per-tile values along ``dim`` repeated per item, cut to the slice's ``size`` items."""
    return scale.repeat_interleave(tile, dim).narrow(dim, phase, size)
