"""``fp8`` on GPU: the Triton kernel over e4m3 weights with per-row scales."""

from __future__ import annotations

import torch


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x @ (weight * scale[:, None]).T`` in ``x``'s dtype."""
    from octavo.model_executor.layers.quantization.triton_kernels import fp8_matmul

    rows = x.reshape(-1, x.shape[-1]).contiguous()
    return fp8_matmul(rows, weight, scale).reshape(*x.shape[:-1], -1)
