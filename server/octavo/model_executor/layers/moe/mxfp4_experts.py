"""gpt-oss's MXFP4 experts kept 4-bit (``quantization`` ``mxfp4``), as vLLM keeps them.

Each expert's projection stays as the checkpoint stores it: per row, groups of 32 values
as 16 bytes of e2m1 codes and one e8m0 scale byte, 17 bytes per 32 weights (4.25 bits).
``FusedMoE`` makes no float stacks for them; the experts' weight slots
(``quantized_experts.CheckpointExperts``) take one ``Mxfp4Tensor`` per expert and
projection, and the grouped expert GEMM dequantizes an expert's matrix (``mxfp4.py``,
transformers' values bit for bit) into the activations' dtype when its rows run.

The checkpoint's ``gate_up_proj`` rows interleave gate and up; each expert's rows are
reordered (gate rows, then up rows: ``FusedMoE``'s layout) as bytes, at load. A
tensor-parallel rank's ``down_proj`` columns need not fall on whole 32-value groups: it
keeps the groups they touch and where its first column sits in the first one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from octavo.model_executor.layers.linear import copy_checked
from octavo.model_executor.layers.moe.mxfp4 import BLOCK_VALUES, dequantize_mxfp4
from octavo.model_executor.layers.quantization.stored_matrix import StoredMatrix, covering

if TYPE_CHECKING:
    from octavo.model_executor.layers.moe.checkpoint import ExpertCheckpoint


@dataclass(frozen=True)
class Mxfp4Tensor(StoredMatrix):
    blocks: torch.Tensor  # uint8 [rows, groups, 16]: two e2m1 codes a byte, low nibble first
    scales: torch.Tensor  # uint8 [rows, groups]: e8m0 exponents, biased by 127
    cols: int = -1  # this slice's columns (-1: every group's)
    phase: int = 0  # where column 0 sits in its first group

    def __post_init__(self) -> None:
        if self.cols < 0:
            object.__setattr__(self, "cols", self.scales.shape[-1] * BLOCK_VALUES - self.phase)

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.blocks.shape[0], self.cols))

    def narrow(self, dim: int, start: int, length: int) -> Mxfp4Tensor:
        if start == 0 and length == self.shape[dim]:
            return self
        if dim == 0:
            rows = slice(start, start + length)
            return Mxfp4Tensor(self.blocks[rows], self.scales[rows], self.cols, self.phase)
        first, groups, phase = covering(self.phase, start, length, BLOCK_VALUES)
        blocks, scales = self.blocks.narrow(1, first, groups), self.scales.narrow(1, first, groups)
        return Mxfp4Tensor(blocks, scales, length, phase)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        values = dequantize_mxfp4(self.blocks, self.scales, dtype)
        return values.narrow(1, self.phase, self.cols)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"blocks": self.blocks, "scales": self.scales}

    def to(self, device: torch.device) -> Mxfp4Tensor:
        blocks, scales = self.blocks.to(device).contiguous(), self.scales.to(device).contiguous()
        return Mxfp4Tensor(blocks, scales, self.cols, self.phase)


def load_kept_mxfp4(
    checkpoint: ExpertCheckpoint,
    moe: nn.Module,
    base: str,
    blocks: torch.Tensor,
    scales: torch.Tensor,
) -> list[str]:
    """This rank's experts of one stacked MXFP4 projection (``blocks [E_local, rows, G, 16]``,
    ``scales [E_local, rows, G]``) into the experts' weight slots; the slots it filled."""
    name = base + "_blocks"
    if base == checkpoint.names.fused_down:
        place = checkpoint.placement
        for local in range(blocks.shape[0]):
            matrix = Mxfp4Tensor(blocks[local], scales[local])
            if matrix.cols != place.intermediate_shard:  # every group read: cut this rank's
                matrix = matrix.narrow(1, place.intermediate_start, place.intermediate_shard)
            copy_checked(moe.w2[local], matrix, name)
        return checkpoint.slots("down")
    for local in range(blocks.shape[0]):
        copy_checked(moe.w13[local], gate_then_up(blocks[local], scales[local]), name)
    return checkpoint.slots("gate", "up")


def gate_then_up(blocks: torch.Tensor, scales: torch.Tensor) -> Mxfp4Tensor:
    """One expert's interleaved gate/up rows (gate at even rows) as gate rows, then up."""
    return Mxfp4Tensor(
        torch.cat([blocks[0::2], blocks[1::2]]), torch.cat([scales[0::2], scales[1::2]])
    )
