"""Quantized experts through the ``LinearMethod`` seam (``--quantization int8`` / ``fp8``).

Each expert's two projections become small linear layers that the method owns, exactly
as a dense layer's: the float weights loaded into ``FusedMoE``'s stacks are handed to
the method's ``process_weights_after_loading`` (per-row int8 or fp8 with fp32 scales,
per expert), and the step's grouped rows go through the method's ``apply``.

Checkpoints that store their experts quantized (``fp8_block``: FP8 tiles per expert;
``mxfp4``: gpt-oss's 4-bit groups) keep them so: ``CheckpointExperts`` gives each expert's
projections an empty ``PrequantizedLinearMethod`` slot that the checkpoint loader fills,
and no float stacks are ever made.
"""

from __future__ import annotations

import torch
from torch import nn

from octavo.model_executor.layers.linear_method import LinearMethod
from octavo.model_executor.layers.quantization.prequantized import PrequantizedLinearMethod
from octavo.model_executor.layers.quantization.registry import linear_method_for

CHECKPOINT_EXPERT_METHODS = ("fp8_block", "mxfp4")  # experts kept as the checkpoint has them
EXPERT_QUANTIZATIONS = ("int8", "fp8", *CHECKPOINT_EXPERT_METHODS)  # int8/fp8: at load
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


class ExpertSlot(nn.Module):
    """One expert's projection as the checkpoint stores it: a weight slot the loader fills
    (``moe/checkpoint.py`` copies into it as into a float stack's rows)."""

    def __init__(self, rows: int, cols: int) -> None:
        super().__init__()
        self.method = PrequantizedLinearMethod()
        self.method.create_weights(self, cols, rows, False)

    def process_weights_after_loading(self) -> None:
        if self.weight is not None:  # (once)
            self.method.process_weights_after_loading(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.apply(self, x)


class CheckpointExperts(nn.Module):
    """Every local expert's gate/up ``[2 I_shard, H]`` and down ``[H, I_shard]`` slots."""

    def __init__(self, experts: int, inter: int, hidden: int) -> None:
        super().__init__()
        self.gate_up = nn.ModuleList(ExpertSlot(2 * inter, hidden) for _ in range(experts))
        self.down = nn.ModuleList(ExpertSlot(hidden, inter) for _ in range(experts))

    def weight_slots(self) -> tuple[list, list]:
        """The slots ``FusedMoE.w13`` / ``w2`` stand for while the checkpoint loads."""
        return [slot.weight for slot in self.gate_up], [slot.weight for slot in self.down]

    def process_weights_after_loading(self) -> None:
        for slot in (*self.gate_up, *self.down):
            slot.process_weights_after_loading()


def experts_sync_with_host(model: nn.Module) -> bool:
    """Whether a MoE layer of ``model`` runs quantized experts through the grouped path
    (``grouped.py``) on every device: it reads each expert's row count on the host every
    step, which a CUDA graph cannot capture (so decode graphs stay off)."""
    return any(
        isinstance(getattr(module, "quantized", None), QuantizedExperts | CheckpointExperts)
        for module in model.modules()
    )
