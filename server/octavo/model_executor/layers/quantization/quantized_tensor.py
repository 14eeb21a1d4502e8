"""A quantized checkpoint matrix, and the weight slot of a layer that keeps it quantized.

``QuantizedTensor`` is a ``[rows, cols]`` matrix as rows of blocks (``blocks.py``). It
answers ``shape`` and ``narrow`` like a tensor, so the parallel layers' weight loaders
slice it for their rank exactly as they slice float weights: whole rows for
column-parallel layers, whole blocks of columns for row-parallel ones.

``QuantizedWeight`` takes its place as a layer's ``weight``: the loaders ``narrow`` it to
the rows a checkpoint tensor fills and ``copy_`` into it; each copy becomes a segment, and
``finish`` joins adjacent segments of one kind into a single block matrix (a fused QKV of
one kind is one kernel call). A float (F32/F16) checkpoint tensor is a float segment.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from octavo.model_executor.checkpoint_slice import materialize
from octavo.model_executor.layers.quantization.blocks import (
    BLOCK_BYTES,
    BlockKind,
    block_columns,
    blocks_linear,
    dequantize,
)
from octavo.model_executor.layers.quantization.stored_matrix import StoredMatrix


@dataclass
class QuantizedTensor:
    blocks: torch.Tensor  # uint8 [rows, cols / block_columns(kind) * bytes per block]
    kind: BlockKind
    cols: int
    column_order: torch.Tensor | None = None  # GPTQ act-order: stored column -> input column

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.blocks.shape[0], self.cols))

    def narrow(self, dim: int, start: int, length: int) -> QuantizedTensor:
        if dim == 0:
            rows = self.blocks[start : start + length]
            return QuantizedTensor(rows, self.kind, self.cols, self.column_order)
        if start == 0 and length == self.cols:
            return self  # the whole width (one tensor-parallel rank)
        if self.column_order is not None:
            raise ValueError("act-order (g_idx) weights cannot be split by input features")
        block = block_columns(self.kind)
        if start % block or length % block:
            raise ValueError(
                f"a {self.kind.name} matrix splits only at multiples of {block} columns "
                f"(asked for columns {start}..{start + length})"
            )
        width = BLOCK_BYTES[self.kind]
        columns = self.blocks[:, start // block * width : (start + length) // block * width]
        return QuantizedTensor(columns, self.kind, length)

    def dequantize(self) -> torch.Tensor:
        """The float32 matrix, in input-column order."""
        weight = dequantize(self.blocks, self.kind)
        if self.column_order is None:
            return weight
        return torch.empty_like(weight).index_copy_(1, self.column_order, weight)


@dataclass
class Segment:
    """Output rows ``[start, start + rows)`` of a layer: quantized blocks or a float matrix."""

    start: int
    weight: QuantizedTensor | torch.Tensor | Any

    @property
    def rows(self) -> int:
        return self.weight.shape[0]

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if isinstance(weight, torch.Tensor):
            return F.linear(x, weight.to(x.dtype))
        if not isinstance(weight, QuantizedTensor):
            return weight.apply(x)  # another storage of the same rows, e.g. the GPU planes
        if weight.column_order is not None:
            x = x.index_select(-1, weight.column_order)
        return blocks_linear(x, weight.blocks, weight.kind)


class QuantizedWeight:
    """A layer's weight slot that keeps what the checkpoint gives it, quantized."""

    def __init__(self, rows: int, cols: int) -> None:
        self.shape = torch.Size((rows, cols))
        self.segments: list[Segment] = []

    def narrow(self, dim: int, start: int, length: int) -> _WeightRows:
        if dim != 0:
            raise ValueError("a quantized weight is filled by whole output rows")
        return _WeightRows(self, start, length)

    def copy_(self, source) -> None:
        _WeightRows(self, 0, self.shape[0]).copy_(source)

    def finish(self, device: torch.device) -> list[Segment]:
        """The segments in row order, adjacent ones of one kind joined, checked complete."""
        ordered = sorted(self.segments, key=lambda segment: segment.start)
        covered = sum(segment.rows for segment in ordered)
        if covered != self.shape[0] or any(
            a.start + a.rows != b.start for a, b in itertools.pairwise(ordered)
        ):
            filled = f"{covered} of {self.shape[0]}"
            raise ValueError(f"quantized weight rows not filled exactly once ({filled})")
        return [_to_device(segment, device) for segment in _join(ordered)]


@dataclass
class _WeightRows:
    parent: QuantizedWeight
    start: int
    rows: int

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.rows, self.parent.shape[1]))

    def copy_(self, source) -> None:
        if not isinstance(source, QuantizedTensor | StoredMatrix):  # (FP8 tiles, MXFP4 kept)
            source = torch.as_tensor(materialize(source)).float()
        self.parent.segments.append(Segment(self.start, source))


def _join(ordered: list[Segment]) -> list[Segment]:
    joined: list[Segment] = []
    for segment in ordered:
        previous = joined[-1].weight if joined else None
        weight = segment.weight
        if (
            isinstance(previous, QuantizedTensor)
            and isinstance(weight, QuantizedTensor)
            and previous.kind == weight.kind
            and previous.column_order is None
            and weight.column_order is None
        ):
            blocks = torch.cat([previous.blocks, weight.blocks])
            joined[-1] = Segment(
                joined[-1].start, QuantizedTensor(blocks, weight.kind, weight.cols)
            )
        else:
            joined.append(segment)
    return joined


def _to_device(segment: Segment, device: torch.device) -> Segment:
    weight = segment.weight
    if isinstance(weight, torch.Tensor | StoredMatrix):
        return Segment(segment.start, weight.to(device))
    order = None if weight.column_order is None else weight.column_order.to(device)
    moved = QuantizedTensor(weight.blocks.to(device).contiguous(), weight.kind, weight.cols, order)
    return Segment(segment.start, moved)
