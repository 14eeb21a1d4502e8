"""4-bit weights on GPU: ``Int4Planes`` and the Triton dequantizing GEMM that reads them.

The blocks (``blocks.py``) interleave scales and nibbles, which suits a CPU walking a
row; a GPU tile wants each quantity in a plane of its own: ``packed [out, in / 2]`` (column
``k`` in byte ``k // 2``, low nibble for even ``k``), ``scales`` and ``offsets``
``[out, in / 32]`` in fp32, so ``w = q * scale + offset``. The kernel loads a tile of
nibbles, widens it to the activations' dtype in registers and feeds ``tl.dot``; the
weights never exist in 16 bits in memory. GPTQ, AWQ and GGUF's Q4_0/Q4_1 all arrive here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from octavo.model_executor.layers.quantization.blocks import BLOCK, BLOCK_BYTES, split_blocks
from octavo.model_executor.layers.quantization.quantized_tensor import QuantizedTensor

FOUR_BIT_KINDS = ("Q4_0", "Q4_1", "Q4_F32")


@dataclass
class Int4Planes:
    packed: torch.Tensor  # uint8 [out, in / 2]
    scales: torch.Tensor  # fp32 [out, in / 32]
    offsets: torch.Tensor  # fp32 [out, in / 32]
    column_order: torch.Tensor | None = None

    @classmethod
    def from_quantized(cls, weight: QuantizedTensor) -> Int4Planes | None:
        """The planes of 4-bit blocks (None for other kinds, which keep their blocks)."""
        if weight.kind.name not in FOUR_BIT_KINDS:
            return None
        rows = weight.blocks.shape[0]
        per_block = weight.blocks.reshape(rows, -1, BLOCK_BYTES[weight.kind])
        scales, offsets, payload = split_blocks(per_block, weight.kind)
        values = torch.cat([payload & 0x0F, payload >> 4], dim=-1).reshape(rows, -1)
        packed = values[:, 0::2] | (values[:, 1::2] << 4)
        return cls(
            packed.contiguous(), scales.contiguous(), offsets.contiguous(), weight.column_order
        )

    def tensors(self) -> dict[str, torch.Tensor]:
        planes = {"packed": self.packed, "scales": self.scales, "offsets": self.offsets}
        return planes if self.column_order is None else {**planes, "order": self.column_order}

    def dequantize(self) -> torch.Tensor:
        """The float32 ``[out, in]`` matrix (stored column order); the reference path."""
        values = torch.stack([self.packed & 0x0F, self.packed >> 4], dim=-1).flatten(1).float()
        scales = self.scales.repeat_interleave(BLOCK, dim=1)
        return values * scales + self.offsets.repeat_interleave(BLOCK, dim=1)

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        if self.column_order is not None:
            x = x.index_select(-1, self.column_order)
        return int4_linear(x, self)


def int4_linear(x: torch.Tensor, planes: Int4Planes) -> torch.Tensor:
    """``x @ W.T`` with the Triton kernel; the result in ``x``'s dtype."""
    from octavo.model_executor.layers.quantization.triton_kernels import int4_matmul

    rows = x.reshape(-1, x.shape[-1]).contiguous()
    out = int4_matmul(rows, planes.packed, planes.scales, planes.offsets)
    return out.reshape(*x.shape[:-1], -1)
