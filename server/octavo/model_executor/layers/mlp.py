"""The dense feed-forward block: ``down(act(gate(x)) * up(x))`` with gate and up fused."""

from __future__ import annotations

import torch
from torch import nn

from octavo.model_executor.layers.linear import MergedColumnParallelLinear, RowParallelLinear


class GatedMLP(nn.Module):
    def __init__(
        self, hidden_size: int, intermediate_size: int, act: nn.Module, method, bias: bool = False
    ) -> None:
        super().__init__()
        self.gate_up = MergedColumnParallelLinear(
            hidden_size, [intermediate_size, intermediate_size], bias=bias, method=method()
        )
        self.down_proj = RowParallelLinear(
            intermediate_size, hidden_size, bias=bias, method=method()
        )
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up(x)))
