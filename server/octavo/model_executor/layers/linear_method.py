"""How a linear layer keeps and applies its weight: the seam for quantization.

A ``LinearMethod`` creates a layer's parameters (in the shapes the layer's shard needs),
may rework them once the checkpoint is loaded, and computes ``x @ W.T + b``. The
parallel layers in ``linear.py`` decide the shapes and which slice of a checkpoint tensor
each rank keeps; the method decides the storage. Quantized methods (int8, fp8, GPTQ,
AWQ, GGUF) and LoRA wrappers plug in here.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from octavo.kernels.cpu_features import onednn_supports_bf16, prepack_enabled
from octavo.model_executor.layers.dense_linear import dense_linear, dense_ops, is_dense, pack_dense


class LinearMethod(Protocol):
    def create_weights(
        self, layer: nn.Module, input_size: int, output_size: int, bias: bool
    ) -> None: ...

    def process_weights_after_loading(self, layer: nn.Module) -> None: ...

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor: ...


class UnquantizedLinearMethod:
    """Weights in the model's dtype. On CPUs they are prepacked once into the native panel
    kernel's layout (``dense_linear.py``): fp32 everywhere, bf16 too (on AMX tiles where the
    CPU has them). Elsewhere (bf16 on AMX with the kernel's tiles off, or where the native
    kernels do not load) oneDNN's blocked layout where torch's oneDNN runs the dtype, else
    plain ``F.linear``, which reorders bf16 on every call and runs fp32 as ``aten::mm`` on
    the plain layout. Measured on an AVX2-only
    AMD EPYC (2 cores, SmolLM2's shapes): fp32 prepacked for oneDNN 1.3-2.5x faster than
    plain at 4-128 rows, even at 1 row; bf16 on AMX about 1.3x on decode-sized matrices."""

    def create_weights(self, layer: nn.Module, input_size: int, output_size: int, bias: bool):
        layer.weight = nn.Parameter(torch.empty(output_size, input_size), requires_grad=False)
        layer.bias = nn.Parameter(torch.empty(output_size), requires_grad=False) if bias else None
        layer.packed_weight = None

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        weight = layer.weight.detach()
        ops = dense_ops(weight.dtype, weight.device)
        if ops is not None:
            layer.packed_weight = pack_dense(ops, weight)
        elif can_pack(weight.dtype, weight.device):
            layer.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        if layer.packed_weight is not None:
            layer.weight = None  # the packed copy replaces it (a tied embedding keeps its own)

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        packed = layer.packed_weight
        if packed is None:
            return F.linear(x, layer.weight, layer.bias)
        if is_dense(packed):
            return dense_linear(x, packed, layer.bias, layer.output_size)
        return torch.ops.mkldnn._linear_pointwise(x, packed, layer.bias, "none", [], "")


def can_pack(dtype: torch.dtype, device: torch.device) -> bool:
    """True where torch's oneDNN can prepack: fp32 on any CPU torch built it for; bf16 only
    where torch reports oneDNN runs it (not on AVX2-only CPUs, nor with oneDNN limited by
    ``ONEDNN_MAX_CPU_ISA``). ``OCTAVO_CPU_PREPACK=0`` turns packing off (A/B measurements)."""
    if device.type != "cpu" or not prepack_enabled():
        return False
    if not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        return False
    if dtype == torch.float32:
        return torch.backends.mkldnn.is_available()
    return dtype == torch.bfloat16 and onednn_supports_bf16()
