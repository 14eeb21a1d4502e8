"""Mamba2's gated RMSNorm: the scan's output times ``silu(gate)``, then normalised over
each group of ``group_size`` channels (one group per ``n_groups``), in float32, as
transformers' ``MambaRMSNormGated`` (the gate before the norm). Groups never straddle a
tensor-parallel shard, so each rank normalises its own channels."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Mamba2GatedNorm(nn.Module):
    def __init__(self, channels: int, group_size: int, eps: float) -> None:
        super().__init__()
        if channels % group_size:
            raise ValueError(f"{channels} channels do not split into groups of {group_size}")
        self.weight = nn.Parameter(torch.ones(channels), requires_grad=False)
        self.group_size, self.eps = group_size, eps

    def forward(self, hidden: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """``hidden``, ``gate`` ``[tokens, channels]`` → ``[tokens, channels]`` in
        ``gate``'s dtype (the model's)."""
        gated = hidden.float() * F.silu(gate.float())
        groups = gated.view(*gated.shape[:-1], -1, self.group_size)
        variance = groups.pow(2).mean(-1, keepdim=True)
        normed = (groups * torch.rsqrt(variance + self.eps)).view_as(gated)
        return self.weight * normed.to(gate.dtype)
