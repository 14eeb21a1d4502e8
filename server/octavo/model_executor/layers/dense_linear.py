"""fp32 linears on the native panel kernel (``kernels/csrc/dense_linear.cpp``).

The weight is packed once into column panels (``[ceil(out / width), in, width]``, width
the build's vector lanes: 16 with AVX-512, 8 with AVX2, 4 otherwise) and the plain copy
dropped. One layout serves every row count, where oneDNN's prepacked fp32 GEMM (used
before, and by vLLM's CPU build) streams a step's weights at 26-34 GB/s for a few rows.
SmolLM2-135M's linears per step (``python -m octavo_bench cpu-linear``), 2 Zen 5 cores,
weights read from memory, panel kernel vs oneDNN: 1 row 12.9 vs 16.9 ms, 8 rows 15.3 vs
19.6, 32 rows 27.6 vs 30.7, 256 rows 163 vs 167; the AVX2 build against oneDNN held to
AVX2: 14.0 vs 20.9 ms at 1 row, 46.4 vs 51.4 at 32, even from 256 rows.
"""

from __future__ import annotations

import torch

from octavo.kernels.cpu_build import native_op_owner
from octavo.kernels.cpu_features import dense_kernel_enabled, prepack_enabled


def dense_ops(dtype: torch.dtype, device: torch.device):
    """The native ops when fp32 linears on ``device`` run on the panel kernel, else None."""
    if dtype != torch.float32 or not prepack_enabled() or not dense_kernel_enabled():
        return None
    return native_op_owner(device, "dense_linear")


def pack_dense(ops, weight: torch.Tensor) -> torch.Tensor:
    """``weight`` ([out, in], fp32) in the kernel's column panels."""
    width = ops.dense_panel_width()
    panels = -(-weight.shape[0] // width)
    packed = torch.empty(panels, weight.shape[1], width, dtype=torch.float32)
    ops.pack_dense_weight(packed, weight)
    return packed


def is_dense(packed: torch.Tensor) -> bool:
    """A panel-packed weight (oneDNN's packed tensors are opaque, not strided)."""
    return packed.layout == torch.strided


def dense_linear(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int
) -> torch.Tensor:
    """``x @ W.T + bias`` for any leading dimensions of ``x``."""
    rows = x.reshape(-1, x.shape[-1])
    if rows.dtype != torch.float32 or rows.stride(-1) != 1:
        rows = rows.float().contiguous()
    out = torch.empty(rows.shape[0], out_features, dtype=torch.float32)
    torch.ops.octavo_cpu.dense_linear(out, rows, packed, bias)
    return out.view(*x.shape[:-1], out_features).to(x.dtype)
