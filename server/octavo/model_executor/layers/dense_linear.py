"""CPU linears on the native panel kernels (``kernels/csrc/dense_linear.cpp``: fp32,
``dense_linear_bf16.cpp``: bf16; their schedule in ``dense_panels.h``).

The weight is packed once into column panels (fp32 ``[ceil(out / width), in, width]``; bf16
by input pairs, ``[ceil(out / width), ceil(in / 2), 2 * width]``; width the build's vector
lanes: 16 with AVX-512, 8 with AVX2, 4 otherwise) and the plain copy dropped. One layout
serves every row count, where oneDNN's prepacked GEMM (used before, and by vLLM's CPU
build) streams a step's weights at 26-36 GB/s for a few rows. SmolLM2-135M's linears per
step (``python -m octavo_bench cpu-linear``), 2 Zen 5 cores, weights read from memory,
panel kernel vs oneDNN, fp32: 1 row 13.0 vs 15.2 ms, 4 rows 16.3 vs 19.9, 32 rows 23.1 vs
32.5, 256 rows 170 vs 167; bf16 (vdpbf16ps): 1 row 7.3 vs 8.9, 32 rows 11.9 vs 15.8, 256
rows 79.6 vs 78.7. The AVX2 build against oneDNN held to AVX2 (fp32, before the row blocks
asked for the next slice): 14.0 vs 20.9 ms at 1 row, 46.4 vs 51.4 at 32, even from 256.
Where the CPU has AMX tiles the bf16 panels run on them (``dense_linear_amx.h``), against
oneDNN's AMX GEMM on an Intel Xeon (2 vCPUs): 1 row 16.5 vs 23.8 ms, 32 rows 21.9 vs 30.6,
64 rows 29.1 vs 34.5, 256 rows 68.1 vs 57.0, 1,024 rows 250 vs 244.
"""

from __future__ import annotations

import torch

from octavo.kernels.cpu_build import native_op_owner
from octavo.kernels.cpu_features import cpu_flags, dense_kernel_enabled, prepack_enabled


def dense_ops(dtype: torch.dtype, device: torch.device):
    """The native ops when linears of ``dtype`` on ``device`` run on the panel kernel, else
    None. Where the CPU has AMX tiles, bf16 runs on the panel kernel only where the kernel
    runs its own AMX tiles (``dense_amx_enabled``: the AVX-512 build, the tile state granted,
    ``OCTAVO_CPU_AMX`` not 0); else on oneDNN, whose bf16 GEMM runs on them too (the
    vdpbf16ps panels are 4-7x slower than either from 32 rows)."""
    if dtype not in (torch.float32, torch.bfloat16):
        return None
    if not prepack_enabled() or not dense_kernel_enabled():
        return None
    ops = native_op_owner(device, "dense_linear")
    if ops is not None and dtype == torch.bfloat16 and "amx_bf16" in cpu_flags():
        return ops if ops.dense_amx_enabled() else None
    return ops


def pack_dense(ops, weight: torch.Tensor) -> torch.Tensor:
    """``weight`` ([out, in], fp32 or bf16) in the kernel's column panels: fp32
    ``[ceil(out / width), in, width]``, bf16 by input pairs ``[ceil(out / width),
    ceil(in / 2), 2 * width]``."""
    width = ops.dense_panel_width()
    panels = -(-weight.shape[0] // width)
    if weight.dtype == torch.bfloat16:
        shape = (panels, -(-weight.shape[1] // 2), 2 * width)
    else:
        shape = (panels, weight.shape[1], width)
    packed = torch.empty(shape, dtype=weight.dtype)
    ops.pack_dense_weight(packed, weight)
    return packed


def is_dense(packed: torch.Tensor) -> bool:
    """A panel-packed weight (oneDNN's packed tensors are opaque, not strided)."""
    return packed.layout == torch.strided


def dense_linear(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int
) -> torch.Tensor:
    """``x @ W.T + bias`` for any leading dimensions of ``x``, in the weight's dtype."""
    rows = x.reshape(-1, x.shape[-1])
    if rows.dtype != packed.dtype or rows.stride(-1) != 1:
        rows = rows.to(packed.dtype).contiguous()
    out = torch.empty(rows.shape[0], out_features, dtype=packed.dtype)
    torch.ops.octavo_cpu.dense_linear(out, rows, packed, bias)
    return out.view(*x.shape[:-1], out_features).to(x.dtype)
