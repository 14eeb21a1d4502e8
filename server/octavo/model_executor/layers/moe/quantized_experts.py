"""Quantized experts through the ``LinearMethod`` seam (``--quantization int8`` / ``fp8``).

Each expert's two projections become small linear layers that the method owns, exactly
as a dense layer's: the float weights loaded into ``FusedMoE``'s stacks are handed to
the method's ``process_weights_after_loading`` (per-row int8 or fp8 with fp32 scales,
per expert), and the step's grouped rows go through the method's ``apply``.
"""

from __future__ import annotations

import torch
from torch import nn

from octavo.model_executor.layers.linear_method import LinearMethod
from octavo.model_executor.layers.quantization.registry import linear_method_for

EXPERT_QUANTIZATIONS = ("int8", "fp8")  # methods that quantize a float checkpoint at load
FLOAT_EXPERT_METHODS = ("gguf",)  # the checkpoint's experts are expanded to float at load


def expert_quantization(quantization: str | None) -> str | None:
    """How the experts of a model run with ``quantization`` are stored (None: float)."""
    return None if quantization in FLOAT_EXPERT_METHODS else quantization


def check_expert_quantization(quantization: str | None) -> None:
    if quantization is not None and quantization not in EXPERT_QUANTIZATIONS:
        raise ValueError(
            f"quantization {quantization!r} is not supported for MoE experts; "
            f"supported: {', '.join(EXPERT_QUANTIZATIONS)}"
        )


class ExpertLinear(nn.Module):
    """One expert's projection (no bias: ``FusedMoE`` adds its biases itself)."""

    def __init__(self, weight: torch.Tensor, method: LinearMethod) -> None:
        super().__init__()
        self.method = method
        self.weight = nn.Parameter(weight.detach().contiguous(), requires_grad=False)
        self.bias = None
        self.packed_weight = None
        method.process_weights_after_loading(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.apply(self, x)


class QuantizedExperts(nn.Module):
    def __init__(self, w13: torch.Tensor, w2: torch.Tensor, quantization: str) -> None:
        super().__init__()
        check_expert_quantization(quantization)
        self.gate_up = nn.ModuleList(
            ExpertLinear(weight, linear_method_for(quantization)) for weight in w13
        )
        self.down = nn.ModuleList(
            ExpertLinear(weight, linear_method_for(quantization)) for weight in w2
        )
