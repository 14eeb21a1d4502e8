"""FP8 block-quantized weights as DeepSeek-V3/R1, Kimi K2, MiniMax-M2 and Qwen3's FP8
releases store them: ``weight`` in e4m3 and ``weight_scale_inv`` in fp32, one scale per
``weight_block_size`` tile (``[block_out, block_in]``, 128 x 128 in every release):
``w[o, i] = fp8[o, i] * scale_inv[o // block_out, i // block_in]``. The last tile of a
dimension that is not a multiple of the block is partial.

Kept as they are (one byte per weight plus the scales). On GPU a Triton GEMM reads the
tiles as stored (``triton_fp8_blocks.py``); elsewhere the torch path widens a layer's
weights tile by tile into the activations' dtype and runs one float GEMM (CPUs have no
FP8 arithmetic).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from octavo.kernels.cpu_build import cpu_ops
from octavo.model_executor.layers.quantization.block_kinds import BLOCK, BlockKind
from octavo.model_executor.layers.quantization.stored_matrix import (
    StoredMatrix,
    covering,
    expand_tiles,
)

FP8_E4M3 = torch.float8_e4m3fn
NATIVE_MIN_VALUES = 1 << 16  # smaller matrices: torch's cast beats a native call's overhead


@dataclass(frozen=True)
class Fp8BlockTensor(StoredMatrix):
    weight: torch.Tensor  # float8_e4m3fn [rows, cols]: this slice's weights
    scale: torch.Tensor  # float32 [row tiles, column tiles] the slice touches
    block: tuple[int, int]  # (block_out, block_in): rows and columns of one tile
    phase: tuple[int, int] = (0, 0)  # where row 0 and column 0 sit in their first tiles

    def __post_init__(self) -> None:
        sizes = zip(self.phase, self.weight.shape, self.block, strict=True)
        tiles = tuple(-(-(phase + size) // block) for phase, size, block in sizes)
        if self.weight.dtype != FP8_E4M3 or tuple(self.scale.shape) != tiles:
            raise ValueError(
                f"FP8 block weight {self.weight.dtype} {tuple(self.weight.shape)} with "
                f"{tuple(self.block)} tiles needs float8_e4m3fn weights and scales of "
                f"shape {tiles}, not {tuple(self.scale.shape)}"
            )

    @property
    def shape(self) -> torch.Size:
        return self.weight.shape

    def narrow(self, dim: int, start: int, length: int) -> Fp8BlockTensor:
        if start == 0 and length == self.weight.shape[dim]:
            return self
        first, tiles, phase = covering(self.phase[dim], start, length, self.block[dim])
        new_phase = (phase, self.phase[1]) if dim == 0 else (self.phase[0], phase)
        return Fp8BlockTensor(
            self.weight.narrow(dim, start, length),
            self.scale.narrow(dim, first, tiles),
            self.block,
            new_phase,
        )

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        rows, cols = self.weight.shape
        values = widen(self.weight)
        per_row = expand_tiles(self.scale.float(), self.block[0], 0, self.phase[0], rows)
        if self.phase[1] == 0 and cols % self.block[1] == 0:  # whole column tiles: a view
            values.view(rows, -1, self.block[1]).mul_(per_row.unsqueeze(-1))
        else:
            values.mul_(expand_tiles(per_row, self.block[1], 1, self.phase[1], cols))
        return values.to(dtype)

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """GPU: the Triton kernel reads the FP8 tiles as stored; elsewhere, dequantize
        and one float GEMM."""
        if x.is_cuda:
            from octavo.model_executor.layers.quantization.triton_fp8_blocks import (
                fp8_block_linear,
            )

            return fp8_block_linear(x, self)
        return super().apply(x)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"fp8": self.weight, "scale_inv": self.scale}

    def to(self, device: torch.device) -> Fp8BlockTensor:
        weight, scale = self.weight.to(device).contiguous(), self.scale.to(device).contiguous()
        return Fp8BlockTensor(weight, scale, self.block, self.phase)


def widen(weight: torch.Tensor) -> torch.Tensor:
    """The e4m3 values as a new float32 tensor: on CPU, for large matrices, through the
    native kernel's table (``FP8_ROWS`` blocks without a scale; 2.1 ms against torch's
    scalar cast's 19.6 ms for a 1536 x 2048 matrix on one thread), else torch's cast."""
    ops = cpu_ops() if weight.device.type == "cpu" else None
    rows, cols = weight.shape
    if ops is None or cols % BLOCK or rows * cols < NATIVE_MIN_VALUES:
        return weight.float()
    values = torch.empty(rows, cols, dtype=torch.float32)
    codes = weight.contiguous().view(torch.uint8)
    ops.dequantize_blocks(values, codes, int(BlockKind.FP8_ROWS), None)
    return values
