"""LoRA wrapping the parallel linear layers: per-slot low-rank deltas, batched by adapter.

``LoRALinear`` keeps its base layer (any ``LinearMethod``: unquantized or quantized) and
``max_loras`` slots of adapter weights. A fused layer has one slice per module it fuses
(q/k/v, gate/up), each with its own A and its rows of B. Under tensor parallelism a
column-parallel layer holds its rows of B and the whole A; a row-parallel one its columns
of A and the whole B, with the rank-sized intermediate all-reduced before B.

Each step the runner sets ``LoRAState.batch``: the rows of the step that use each slot.
The delta of a slot's rows is ``(x A^T) B^T`` (B pre-scaled), added to the base output;
rows of the base model get none, and a layer no adapter of the step adapts is skipped.
On the CPU (fp32 weights), the native kernel ``octavo_cpu.lora_delta`` multiplies each
row by its own slot's A and B only (decode-sized steps, and any step with many slots);
otherwise one shrink matmul multiplies every row by every slot and slice, each row's
own slot kept by a mask, then one expand matmul against a block matrix of every B: two
GEMMs per layer however many adapters the step mixes. On GPU, two Triton launches for
all rows and slices (``lora_kernels``), each row reading its slot's A and B
(Punica/S-LoRA's gather-and-batched-matmul).
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import nn

from octavo.kernels.cpu_build import ops_for
from octavo.model_executor.layers.linear import (
    LinearBase,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from octavo.model_executor.layers.lora_gemm import LoRAGemms

# When the native CPU kernel takes a step: it costs about the same per row whatever the
# slots, the masked GEMMs cost per row and slot (every row meets every slot). Measured on
# 2 cores (bf16, SmolLM2's q/k/v, rank 16), kernel against GEMMs: 1 slot 20 rows 40/60 µs,
# 64 rows 97/87, 1024 rows 1334/475; 4 slots 20 rows 35/87, 256 rows 339/446; 16 slots
# 1024 rows 1521/6784. So: decode-sized steps always, any step from 4 slots on.
NATIVE_MAX_ROWS = 64
NATIVE_MIN_SLOTS = 4


@dataclass
class LoRABatch:
    groups: list[tuple[int, torch.Tensor]] = field(default_factory=list)  # (slot, row ids)
    slots: torch.Tensor | None = field(default=None, repr=False, compare=False)  # row_slots
    masks: dict[tuple, torch.Tensor] = field(default_factory=dict, repr=False, compare=False)

    def row_slots(self, num_rows: int, device: torch.device) -> torch.Tensor:
        """Each row's slot (int32, ``-1``: base model); made once, shared by every layer."""
        if self.slots is None or self.slots.shape[0] != num_rows or self.slots.device != device:
            slots = torch.full((num_rows,), -1, dtype=torch.int32, device=device)
            for slot, rows in self.groups:
                slots.index_fill_(0, rows.to(device), slot)
            self.slots = slots
        return self.slots

    def column_mask(
        self, num_rows: int, layout: tuple[int, int, int], device: torch.device, dtype: torch.dtype
    ) -> torch.Tensor:
        """[rows, slice * slot * rank]: 1 in the columns of each row's slot, else 0 (all 0
        for the base model); made once a step for each layout (slices, slots, rank)."""
        key = (*layout, dtype)
        mask = self.masks.get(key)
        if mask is None or mask.shape[0] != num_rows or mask.device != device:
            num_slices, num_slots, rank = layout
            slots = self.row_slots(num_rows, device).long()
            one_hot = torch.zeros(num_rows, num_slots + 1, dtype=dtype, device=device)
            one_hot.scatter_(1, (slots % (num_slots + 1)).unsqueeze(1), 1.0)
            per_slot = one_hot[:, :num_slots]  # slot -1 landed in the extra last column
            mask = per_slot[:, None, :, None].expand(-1, num_slices, -1, rank)
            self.masks[key] = mask = mask.reshape(num_rows, -1).contiguous()
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
    def __init__(
        self,
        base: LinearBase,
        slices: list[LoRASlice],
        input_start: int | None,
        size: LoRASize,
        state: LoRAState,
    ) -> None:
        super().__init__()
        self.base, self.slices, self.state = base, slices, state
        self.input_start = input_start  # row-parallel: A's columns start here
        max_loras, max_rank, dtype, device = size
        self.activation_dtype = dtype
        if device.type == "cpu":
            dtype = torch.float32  # kept in fp32; lora_gemm packs bf16 copies where it pays
        a_shape = (max_loras, len(slices), max_rank, base.input_size)
        self.register_buffer("lora_a", torch.zeros(a_shape, dtype=dtype, device=device))
        b_shape = (max_loras, base.output_size, max_rank)
        self.register_buffer("lora_b", torch.zeros(b_shape, dtype=dtype, device=device))
        # The torch path's copies, ordered (slice, slot, rank): A row by row, and B as a
        # block matrix whose rows of slice s reach only slice s's output columns.
        flat_shape = (len(slices), max_loras, max_rank)
        needs_torch = not (device.type == "cuda" and triton_available())
        for name, width in (("flat_a", base.input_size), ("block_b", base.output_size)):
            copy = torch.zeros(*flat_shape, width, dtype=dtype, device=device)
            self.register_buffer(name, copy if needs_torch else None)
        self.active = [False] * max_loras  # slots whose adapter adapts this layer
        self.gemms: LoRAGemms | None = None  # made from flat_a/block_b when first needed
        self.native_weights: tuple[torch.Tensor, torch.Tensor] | None = None  # likewise

    def set_slot(
        self, slot: int, weights: dict[str, tuple[torch.Tensor, torch.Tensor]], scaling: float
    ) -> None:
        """Write one adapter's A and scaled B (whole, by module) into ``slot``."""
        self.lora_a[slot].zero_()
        self.lora_b[slot].zero_()
        if self.flat_a is not None and self.block_b is not None:
            self.flat_a[:, slot].zero_()
            self.block_b[:, slot].zero_()
        self.active[slot], self.gemms, self.native_weights = False, None, None
        for index, piece in enumerate(self.slices):
            if piece.module not in weights:
                continue
            a, b = weights[piece.module]
            rank = a.shape[0]
            if self.input_start is not None:
                a = a[:, self.input_start : self.input_start + self.base.input_size]
            rows = b[piece.start : piece.start + piece.size] * scaling
            end = piece.offset + piece.size
            self.lora_a[slot, index, :rank].copy_(a)
            self.lora_b[slot, piece.offset : end, :rank].copy_(rows)
            if self.flat_a is not None and self.block_b is not None:
                self.flat_a[index, slot, :rank].copy_(a)
                self.block_b[index, slot, :rank, piece.offset : end].copy_(rows.T)
            self.active[slot] = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        batch = self.state.batch
        if batch is None or not any(self.active[slot] for slot, _ in batch.groups):
            return out  # no row of this step uses an adapter that adapts this layer
        if use_triton(x):
            return self._add_deltas_triton(out, x, batch)
        return self._add_deltas_torch(out, x, batch)

    def _add_deltas_torch(
        self, out: torch.Tensor, x: torch.Tensor, batch: LoRABatch
    ) -> torch.Tensor:
        """Every row at once, whatever the adapters: one shrink against every slot and
        slice, each row keeping its own slot's (the rest masked to zero, all of it for
        base-model rows), then one expand against the block matrix of every B. A
        decode-sized step on the CPU takes the native kernel instead (``_native_ops``)."""
        assert self.flat_a is not None and self.block_b is not None
        ops = self._native_ops(x)
        if ops is not None:
            if self.native_weights is None:  # bf16 activations: bf16 copies, half the reads
                dtype = torch.bfloat16 if x.dtype == torch.bfloat16 else torch.float32
                self.native_weights = (self.flat_a.to(dtype), self.block_b.to(dtype))
            row_slots = batch.row_slots(x.shape[0], x.device)
            ops.lora_delta(out, x, *self.native_weights, row_slots, *self._slice_columns)
            return out
        if self.gemms is None:
            self.gemms = LoRAGemms.of(self.flat_a, self.block_b, self.activation_dtype)
        layout = self.flat_a.shape[:3]  # slices, slots, rank
        mask = batch.column_mask(x.shape[0], layout, x.device, self.gemms.dtype)
        own = self.gemms.shrink(x, mask)  # [rows, slice * slot * rank], others' zeroed
        if self.input_start is not None:  # row-parallel: partial sums over the input
            own = self.base.tp.all_reduce(own)
        return self.gemms.expand_into(out, own)

    def _native_ops(self, x: torch.Tensor):
        """The native CPU ops when they take this step (each row times its own slot's A
        and B): at most ``NATIVE_MAX_ROWS`` rows or at least ``NATIVE_MIN_SLOTS`` slots
        (below both, two GEMMs against every slot cost less), contiguous rows, and no
        all-reduce between A and B."""
        few_slots = len(self.active) < NATIVE_MIN_SLOTS
        if (x.shape[0] > NATIVE_MAX_ROWS and few_slots) or x.stride(-1) != 1:
            return None
        if self.input_start is not None and self.base.tp.size > 1:
            return None  # row-parallel under TP: the rank-sized sums meet before B
        return ops_for(x)

    @functools.cached_property
    def _slice_columns(self) -> tuple[list[int], list[int]]:
        """Each slice's first output column and width, as the native kernel takes them."""
        return [piece.offset for piece in self.slices], [piece.size for piece in self.slices]

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
        return [
            LoRASlice(name, offset, rows, start)
            for name, (start, rows, offset) in zip(modules, layer.sources.values(), strict=True)
        ]
    if isinstance(layer, MergedColumnParallelLinear):
        slices, offset = [], 0
        for name, (start, end) in zip(modules, layer.shards, strict=True):
            slices.append(LoRASlice(name, offset, end - start, start))
            offset += end - start
        return slices
    if isinstance(layer, RowParallelLinear):
        return [LoRASlice(modules[0], 0, layer.output_size, 0)]
    return [LoRASlice(modules[0], 0, layer.output_size, layer.output_start)]  # column-parallel
