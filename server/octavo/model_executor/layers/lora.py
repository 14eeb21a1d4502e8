"""LoRA wrapping the parallel linear layers: per-slot low-rank deltas, batched by adapter.

``LoRALinear`` keeps its base layer (any ``LinearMethod``: unquantized or quantized) and
``max_loras`` slots of adapter weights. A fused layer has one slice per module it fuses
(q/k/v, gate/up), each with its own A and its rows of B. Under tensor parallelism a
column-parallel layer holds its rows of B and the whole A; a row-parallel one its columns
of A and the whole B, with the rank-sized intermediate all-reduced before B.

Each step the runner sets ``LoRAState.batch``: the rows of the step that use each slot.
The delta of a slot's rows is ``(x A^T) B^T`` (B pre-scaled), added to the base output;
rows of the base model get none. In torch (CPU, fp32 weights): every row against every
slot in one shrink matmul, each row's own slot kept by a mask, then one expand matmul per
slice — a fixed number of GEMMs per layer however many adapters the step mixes. On GPU,
two Triton launches for all rows and slices (``lora_kernels``), each row reading its
slot's A and B (Punica/S-LoRA's gather-and-batched-matmul).
"""

from __future__ import annotations

import functools
import importlib.util
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
    slots: torch.Tensor | None = field(default=None, repr=False, compare=False)  # row_slots
    masks: dict[torch.dtype, torch.Tensor] = field(default_factory=dict, repr=False,
                                                   compare=False)  # fmt: skip

    def row_slots(self, num_rows: int, device: torch.device) -> torch.Tensor:
        """Each row's slot (int32, ``-1``: base model); made once, shared by every layer."""
        if self.slots is None or self.slots.shape[0] != num_rows or self.slots.device != device:
            slots = torch.full((num_rows,), -1, dtype=torch.int32, device=device)
            for slot, rows in self.groups:
                slots.index_fill_(0, rows.to(device), slot)
            self.slots = slots
        return self.slots

    def slot_mask(self, num_rows: int, num_slots: int, device: torch.device,
                  dtype: torch.dtype) -> torch.Tensor:  # fmt: skip
        """[rows, slots]: 1 at each row's slot, 0 elsewhere (all 0 for the base model)."""
        mask = self.masks.get(dtype)
        if mask is None or mask.shape != (num_rows, num_slots) or mask.device != device:
            slots = self.row_slots(num_rows, device).long()
            mask = torch.zeros(num_rows, num_slots + 1, dtype=dtype, device=device)
            mask.scatter_(1, (slots % (num_slots + 1)).unsqueeze(1), 1.0)
            mask = mask[:, :num_slots]  # slot -1 landed in the extra last column
            self.masks[dtype] = mask
        return mask


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
        dtype = torch.float32 if device.type == "cpu" else dtype  # no bf16 GEMMs on many CPUs
        a_shape = (max_loras, len(slices), max_rank, base.input_size)
        self.register_buffer("lora_a", torch.zeros(a_shape, dtype=dtype, device=device))
        b_shape = (max_loras, base.output_size, max_rank)
        self.register_buffer("lora_b", torch.zeros(b_shape, dtype=dtype, device=device))
        bt_shape = (max_loras, max_rank, base.output_size)  # the torch path's B, transposed
        needs_bt = not (device.type == "cuda" and triton_available())
        bt = torch.zeros(bt_shape, dtype=dtype, device=device) if needs_bt else None
        self.register_buffer("lora_bt", bt)

    def set_slot(self, slot: int, weights: dict[str, tuple[torch.Tensor, torch.Tensor]],
                 scaling: float) -> None:  # fmt: skip
        """Write one adapter's A and scaled B (whole, by module) into ``slot``."""
        self.lora_a[slot].zero_()
        self.lora_b[slot].zero_()
        if self.lora_bt is not None:
            self.lora_bt[slot].zero_()
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
            if self.lora_bt is not None:
                self.lora_bt[slot, :rank, piece.offset : piece.offset + piece.size].copy_(rows.T)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        batch = self.state.batch
        if batch is None or not batch.groups:
            return out
        if use_triton(x):
            return self._add_deltas_triton(out, x, batch)
        return self._add_deltas_torch(out, x, batch)

    def _add_deltas_torch(
        self, out: torch.Tensor, x: torch.Tensor, batch: LoRABatch
    ) -> torch.Tensor:
        """Every row at once, whatever the adapters: one shrink against every slot, each
        row keeping its own slot's (the rest masked to zero, all of it for base-model
        rows), then one expand per slice against every slot's B."""
        assert self.lora_bt is not None
        num_slots, num_slices, rank, width = self.lora_a.shape
        mask = batch.slot_mask(x.shape[0], num_slots, x.device, self.lora_a.dtype)
        flat_a = self.lora_a.view(num_slots * num_slices * rank, width)
        shrunk = x.to(flat_a.dtype) @ flat_a.T  # [rows, slot * slice * rank]
        if self.input_start is not None:  # row-parallel: partial sums over the input
            shrunk = self.base.tp.all_reduce(shrunk)
        shrunk = shrunk.view(-1, num_slots, num_slices, rank) * mask[:, :, None, None]
        for index, piece in enumerate(self.slices):
            end = piece.offset + piece.size
            b = self.lora_bt[:, :, piece.offset : end].reshape(num_slots * rank, piece.size)
            own = shrunk[:, :, index].reshape(-1, num_slots * rank)
            out[:, piece.offset : end] += (own @ b).to(out.dtype)
        return out

    def _add_deltas_triton(
        self, out: torch.Tensor, x: torch.Tensor, batch: LoRABatch
    ) -> torch.Tensor:
        """The GPU path: one shrink and one expand launch for every row and slice."""
        from octavo.model_executor.layers.lora_kernels import lora_expand, lora_shrink

        row_slots = batch.row_slots(x.shape[0], x.device)
        shrunk = lora_shrink(x, self.lora_a, row_slots)  # [slices, rows, max_rank], fp32
        if self.input_start is not None:  # row-parallel: partial sums over the input
            shrunk = self.base.tp.all_reduce(shrunk)
        offsets = tuple(piece.offset for piece in self.slices)
        sizes = tuple(piece.size for piece in self.slices)
        return lora_expand(out, shrunk, self.lora_b, row_slots, offsets, sizes)


@functools.cache
def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def use_triton(x: torch.Tensor) -> bool:
    """Whether the deltas take the Triton path (CUDA activations, triton installed)."""
    return x.is_cuda and triton_available()


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
