"""SiLU(gate) · up over the fused gate/up projection."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octavo.kernels.cpu_build import ops_for


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [tokens, 2d]`` (gate, then up) → ``[tokens, d]``."""
        ops = ops_for(x)
        if ops is None or x.stride(-1) != 1:
            return self.forward_native(x)
        out = torch.empty(x.shape[0], x.shape[1] // 2, dtype=x.dtype, device=x.device)
        ops.silu_and_mul(out, x)
        return out

    @staticmethod
    def forward_native(x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
