"""``int8``: W8A8 — weights quantized at load (per output channel, symmetric), activations
per token at run time, an int8 GEMM (``torch._int_mm``: oneDNN's VNNI/AMX kernels on CPU,
cuBLASLt on GPU) with int32 accumulation, rescaled to the activations' dtype.

A bf16/fp32 checkpoint is loaded as usual, then each weight is replaced by its int8 copy
and one fp32 scale per output row: a quarter of fp32's bytes, half of bf16's.
"""

from __future__ import annotations

import torch
from torch import nn

from octavo.model_executor.layers.linear_method import UnquantizedLinearMethod

INT8_MAX = 127.0
CUDA_MIN_ROWS = 17  # cuBLASLt's int8 GEMM wants more than 16 rows


def quantize_per_row(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 of each row and its fp32 scale: ``values ≈ q * scale[:, None]``."""
    values = values.float()
    scale = values.abs().amax(dim=-1).clamp(min=1e-8) / INT8_MAX
    quantized = torch.round(values / scale.unsqueeze(-1)).clamp_(-INT8_MAX, INT8_MAX)
    return quantized.to(torch.int8), scale


class Int8LinearMethod(UnquantizedLinearMethod):
    """Created like the unquantized method (the loaders copy float shards in), quantized
    once loaded."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        quantized, scale = quantize_per_row(layer.weight.detach())
        layer.register_buffer("qweight_t", quantized.t().contiguous(), persistent=False)
        layer.register_buffer("weight_scale", scale, persistent=False)
        layer.weight = None  # the float copy is no longer needed

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        quantized, x_scale = quantize_per_row(rows)
        count = quantized.shape[0]
        if rows.is_cuda and count < CUDA_MIN_ROWS:
            padding = quantized.new_zeros(CUDA_MIN_ROWS - count, quantized.shape[1])
            quantized = torch.cat([quantized, padding])
        accumulated = torch._int_mm(quantized, layer.qweight_t)[:count]
        out = accumulated.float().mul_(x_scale.unsqueeze(-1)).mul_(layer.weight_scale)
        if layer.bias is not None:
            out += layer.bias.float()
        return out.to(x.dtype).reshape(*x.shape[:-1], -1)
