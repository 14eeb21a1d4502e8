"""``int8``: W8A8 — weights quantized at load (per output channel, symmetric), activations
quantized at run time, int8 products summed in int32, rescaled to the activations' dtype.

A bf16/fp32 checkpoint is loaded as usual, then each weight is replaced by its int8 copy
and one fp32 scale per output row: a quarter of fp32's bytes, half of bf16's.

- CPU, a few rows (decode): the native block kernel (``blocks.py``, kind ``INT8_ROWS``):
  activations quantized per 32 columns, integer dot products with AVX2/AVX-512.
- CPU with int8 dot products (AVX-512 VNNI, AVX-VNNI or AMX), more than
  ``GEMM_FROM_ROWS - 1`` rows: ``torch._int_mm`` (oneDNN's VNNI/AMX int8 GEMM) on
  activations quantized per token.
- CPU without them: ``blocks_linear`` as for GGUF's blocks (the integer kernel up to its
  row limit, then the weights dequantized into the activations' dtype and a float GEMM).
  ``torch._int_mm`` has no fast path there: on the AVX2-only AMD EPYC, one thread, a
  1536 x 576 linear took 38 ms at 64 rows and 166 ms at 256 against 1.5-1.7 and 5.5
  dequantized (fp32's own 1.3-1.7 and 5.2), and SmolLM2's start-up spent 58 s capturing
  its decode graphs (5 s in fp32).
- GPU: ``torch._int_mm`` (cuBLASLt) on activations quantized per token.
"""

from __future__ import annotations

import torch
from torch import nn

from octavo.kernels.cpu_features import cpu_has_int8_dot
from octavo.model_executor.layers.linear_method import UnquantizedLinearMethod
from octavo.model_executor.layers.quantization.blocks import (
    BLOCK,
    BlockKind,
    blocks_linear,
)

INT8_MAX = 127.0
CUDA_MIN_ROWS = 17  # cuBLASLt's int8 GEMM wants more than 16 rows
GEMM_FROM_ROWS = 5  # with int8 dot products, torch._int_mm from this many rows


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
        layer.register_buffer("qweight", quantized, persistent=False)  # [out, in]
        layer.register_buffer("weight_scale", scale, persistent=False)
        layer.weight = None  # the float copy is no longer needed

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        if _on_blocks(rows):
            blocks = layer.qweight.view(torch.uint8)
            out = blocks_linear(rows, blocks, BlockKind.INT8_ROWS, layer.weight_scale)
        else:
            out = int8_matmul(rows, layer.qweight, layer.weight_scale)
        if layer.bias is not None:
            out = out + layer.bias
        return out.reshape(*x.shape[:-1], -1)


def _on_blocks(rows: torch.Tensor) -> bool:
    """CPU rows the block path takes: a few (the integer kernel), or any number where the
    CPU has no int8 dot products."""
    if rows.is_cuda or rows.shape[1] % BLOCK != 0:
        return False
    return rows.shape[0] < GEMM_FROM_ROWS or not cpu_has_int8_dot()


def int8_matmul(rows: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor):
    """W8A8 through ``torch._int_mm``, activations quantized per token."""
    quantized, x_scale = quantize_per_row(rows)
    count = quantized.shape[0]
    if rows.is_cuda and count < CUDA_MIN_ROWS:
        padding = quantized.new_zeros(CUDA_MIN_ROWS - count, quantized.shape[1])
        quantized = torch.cat([quantized, padding])
    accumulated = torch._int_mm(quantized, qweight.t())[:count]
    out = accumulated.float().mul_(x_scale.unsqueeze(-1)).mul_(weight_scale)
    return out.to(rows.dtype)
