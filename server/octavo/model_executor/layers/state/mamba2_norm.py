"""Mamba2's gated RMSNorm: the scan's output times ``silu(gate)``, then normalised over
each group of ``group_size`` channels (one group per ``n_groups``), in float32, as
transformers' ``MambaRMSNormGated`` (the gate before the norm). Under tensor parallelism a
rank holds whole groups, or (one group over several ranks) a slice of the one group: its
sum of squares is then summed over the ranks."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octavo.distributed.parallel_state import TensorParallelGroup


class Mamba2GatedNorm(nn.Module):
    def __init__(
        self,
        channels: int,
        group_size: int,
        eps: float,
        spans: TensorParallelGroup | None = None,
    ) -> None:
        """``channels``: this rank's; ``spans``: the ranks one group is split over (None:
        each rank holds whole groups)."""
        super().__init__()
        self.local_group = channels if spans is not None else group_size
        if channels % self.local_group:
            raise ValueError(f"{channels} channels do not split into groups of {group_size}")
        self.weight = nn.Parameter(torch.ones(channels), requires_grad=False)
        self.group_size, self.eps, self.spans = group_size, eps, spans

    def forward(self, hidden: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """``hidden``, ``gate`` ``[tokens, channels]`` → ``[tokens, channels]`` in
        ``gate``'s dtype (the model's)."""
        gated = hidden.float() * F.silu(gate.float())
        groups = gated.view(*gated.shape[:-1], -1, self.local_group)
        squares = groups.pow(2).sum(-1, keepdim=True)
        if self.spans is not None:
            squares = self.spans.all_reduce(squares)
        normed = groups * torch.rsqrt(squares / self.group_size + self.eps)
        return self.weight * normed.view_as(gated).to(gate.dtype)
