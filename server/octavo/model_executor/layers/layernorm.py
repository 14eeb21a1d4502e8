"""RMSNorm, optionally fused with the residual add before it (as vLLM's layers do)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octavo.kernels.cpu_build import ops_for


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
