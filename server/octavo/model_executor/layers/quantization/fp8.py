"""``fp8``: FP8 (e4m3) weights of a float checkpoint, quantized at load, one fp32 scale per
output row (vLLM's dynamic FP8; per-row scales keep a row's small weights from being
crushed by another row's outliers).

On GPU the Triton kernel (``triton_fp8.py``) reads the FP8 weights tile by tile and
multiplies in the activations' dtype; on CPU the weights (scale included) are widened to
the activations' dtype for each call by the native dequantization kernel, then one GEMM:
a correct but slower path (CPUs have no FP8 arithmetic), kept so the method runs and is
tested anywhere.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octavo.kernels.cpu_build import cpu_ops
from octavo.model_executor.layers.linear_method import UnquantizedLinearMethod
from octavo.model_executor.layers.quantization.blocks import BlockKind, dequantize_like

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0


def quantize_fp8_per_row(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 of each row and its fp32 scale: ``values ≈ q.float() * scale[:, None]``."""
    values = values.float()
    scale = values.abs().amax(dim=-1).clamp(min=1e-12) / FP8_MAX
    return (values / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


class Fp8LinearMethod(UnquantizedLinearMethod):
    """Created like the unquantized method (the loaders copy float shards in), quantized
    once loaded."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        quantized, scale = quantize_fp8_per_row(layer.weight.detach())
        layer.register_buffer("fp8_weight", quantized, persistent=False)
        layer.register_buffer("weight_scale", scale, persistent=False)
        layer.weight = None

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            from octavo.model_executor.layers.quantization.triton_fp8 import fp8_linear

            out = fp8_linear(x, layer.fp8_weight, layer.weight_scale)
        else:  # the native kernel widens the bytes through a table (torch's cast is scalar)
            blocks = layer.fp8_weight.view(torch.uint8)
            widened = dequantize_like(x, blocks, BlockKind.FP8_ROWS, layer.weight_scale, cpu_ops())
            out = F.linear(x, widened)
        return out if layer.bias is None else out + layer.bias
