"""RMSNorm, optionally fused with the residual add before it (as vLLM's layers do)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octavo.kernels.cpu_build import ops_for


def on_gpu(x: torch.Tensor, residual: torch.Tensor | None) -> bool:
    """The Triton kernel's case: contiguous ``[tokens, hidden]`` CUDA rows (and residual)."""
    contiguous = x.is_contiguous() and (residual is None or residual.is_contiguous())
    return x.is_cuda and x.dim() == 2 and contiguous


def triton_rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None
) -> torch.Tensor:
    from octavo.model_executor.layers.triton_norm import rms_norm_triton

    return rms_norm_triton(x, weight, eps, residual)


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.eps = eps

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``norm(x)``; with ``residual``: ``(norm(x + residual), x + residual)``.

        The native path works in place: ``x`` and ``residual`` are overwritten.
        """
        if on_gpu(x, residual):
            out = triton_rms_norm(x, self.weight, self.eps, residual)
            return out if residual is None else (out, residual)
        ops = ops_for(x)
        if ops is None or not x.is_contiguous():
            return self.forward_native(x, residual)
        if residual is None:
            out = torch.empty_like(x)
            ops.rms_norm(out, x, self.weight, self.eps)
            return out
        ops.fused_add_rms_norm(x, residual, self.weight, self.eps)
        return x, residual

    def forward_native(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The torch reference (and the path for GPUs and other dtypes)."""
        if residual is not None:
            x = residual = x + residual
        out = F.rms_norm(x, x.shape[-1:], self.weight, self.eps)
        return out if residual is None else (out, residual)


class GemmaRMSNorm(nn.Module):
    """Gemma 2/3's RMSNorm: the weight is stored as ``w`` and applied as ``1 + w``, in float32.

    As transformers' Gemma2RMSNorm/Gemma3RMSNorm: ``(x / rms(x)) * (1 + w)`` computed in
    float32 from ``x.float()``, then cast to ``x``'s dtype once (Llama's RMSNorm casts before
    the weight). The residual add before it is in the model dtype, as Gemma's decoder layer
    adds. The native CPU kernel runs float32 only (with ``1 + w`` as its weight): its weight
    shares the activations' dtype, and ``1 + w`` rounded to bfloat16 would differ from HF.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_size), requires_grad=False)
        self.eps = eps

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``norm(x)``; with ``residual``: ``(norm(x + residual), x + residual)``.

        As RMSNorm's, the native path works in place: ``x`` and ``residual`` are overwritten.
        """
        ops = ops_for(x)
        if ops is None or x.dtype != torch.float32 or x.dim() != 2 or not x.is_contiguous():
            return self.forward_native(x, residual)
        weight = 1.0 + self.weight.float()
        if residual is None:
            out = torch.empty_like(x)
            ops.rms_norm(out, x, weight, self.eps)
            return out
        ops.fused_add_rms_norm(x, residual, weight, self.eps)
        return x, residual

    def forward_native(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The torch reference: transformers' Gemma3RMSNorm, operation for operation."""
        if residual is not None:
            x = residual = x + residual
        hidden = x.float()
        hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.eps)
        out = (hidden * (1.0 + self.weight.float())).type_as(x)
        return out if residual is None else (out, residual)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}"
