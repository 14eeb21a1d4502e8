"""LoRA wrapping the parallel linear layers: per-slot low-rank deltas, batched by adapter.

``LoRALinear`` keeps its base layer (any ``LinearMethod``: unquantized or quantized) and
``max_loras`` slots of adapter weights. A fused layer has one slice per module it fuses
(q/k/v, gate/up), each with its own A and its rows of B. Under tensor parallelism a
column-parallel layer holds its rows of B and the whole A; a row-parallel one its columns
of A and the whole B, with the rank-sized intermediate all-reduced before B.

Each step the runner sets ``LoRAState.batch``: the rows of the step that use each slot.
The delta of a slot's rows is ``(x A^T) B^T`` (B pre-scaled), added to the base output;
rows of the base model get none. (Punica/S-LoRA's gather-and-batched-matmul, in torch:
one pair of matmuls per adapter present in the step.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import nn

from octavo.model_executor.layers.linear import (
    LinearBase,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)


@dataclass
class LoRABatch:
    groups: list[tuple[int, torch.Tensor]] = field(default_factory=list)  # (slot, row ids)


@dataclass
class LoRAState:
    """Shared by every LoRA layer of one model; the runner sets it before each forward."""

    batch: LoRABatch | None = None


class LoRASize(NamedTuple):
    max_loras: int  # slots
    max_rank: int
    dtype: torch.dtype  # the activations'
    device: torch.device


@dataclass(frozen=True)
class LoRASlice:
    module: str  # the PEFT module name (q_proj, ...)
    offset: int  # first output feature of this slice in the (fused) layer's output
    size: int  # output features of this slice on this rank
    start: int  # its first row in the module's whole B


class LoRALinear(nn.Module):
    def __init__(self, base: LinearBase, slices: list[LoRASlice], input_start: int | None,
                 size: LoRASize, state: LoRAState) -> None:  # fmt: skip
        super().__init__()
        self.base, self.slices, self.state = base, slices, state
        self.input_start = input_start  # row-parallel: A's columns start here
        max_loras, max_rank, dtype, device = size
        a_shape = (max_loras, len(slices), max_rank, base.input_size)
        self.register_buffer("lora_a", torch.zeros(a_shape, dtype=dtype, device=device))
        b_shape = (max_loras, base.output_size, max_rank)
        self.register_buffer("lora_b", torch.zeros(b_shape, dtype=dtype, device=device))

    def set_slot(self, slot: int, weights: dict[str, tuple[torch.Tensor, torch.Tensor]],
                 scaling: float) -> None:  # fmt: skip
        """Write one adapter's A and scaled B (whole, by module) into ``slot``."""
        self.lora_a[slot].zero_()
        self.lora_b[slot].zero_()
        for index, piece in enumerate(self.slices):
            if piece.module not in weights:
                continue
            a, b = weights[piece.module]
            rank = a.shape[0]
            if self.input_start is not None:
                a = a[:, self.input_start : self.input_start + self.base.input_size]
            rows = b[piece.start : piece.start + piece.size] * scaling
            self.lora_a[slot, index, :rank].copy_(a)
            self.lora_b[slot, piece.offset : piece.offset + piece.size, :rank].copy_(rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        batch = self.state.batch
        if batch is None or not batch.groups:
            return out
        for slot, rows in batch.groups:
            out.index_add_(0, rows, self._delta(slot, x.index_select(0, rows)))
        return out

    def _delta(self, slot: int, x: torch.Tensor) -> torch.Tensor:
        delta = torch.zeros(x.shape[0], self.base.output_size, dtype=x.dtype, device=x.device)
        for index, piece in enumerate(self.slices):
            shrunk = x @ self.lora_a[slot, index].T  # [rows, max_rank]
            if self.input_start is not None:  # row-parallel: partial sums over the input
                shrunk = self.base.tp.all_reduce(shrunk)
            end = piece.offset + piece.size
            delta[:, piece.offset : end] = shrunk @ self.lora_b[slot, piece.offset : end].T
        return delta


def lora_slices(layer: LinearBase, modules: tuple[str, ...]) -> list[LoRASlice]:
    """Where each fused module's rows sit in ``layer``'s output on this rank."""
    if isinstance(layer, QKVParallelLinear):
        return [LoRASlice(name, offset, rows, start)
                for name, (start, rows, offset) in zip(modules, layer.sources.values(),
                                                       strict=True)]  # fmt: skip
    if isinstance(layer, MergedColumnParallelLinear):
        slices, offset = [], 0
        for name, (start, end) in zip(modules, layer.shards, strict=True):
            slices.append(LoRASlice(name, offset, end - start, start))
            offset += end - start
        return slices
    if isinstance(layer, RowParallelLinear):
        return [LoRASlice(modules[0], 0, layer.output_size, 0)]
    return [LoRASlice(modules[0], 0, layer.output_size, layer.output_start)]  # column-parallel
