"""Rotary embedding on GPU as one Triton kernel, in place over a strided query/key view.

The torch path builds the rotated half with ``torch.cat``, multiplies by the cos and sin
rows, adds and copies back: five kernels a layer, each reading the heads again. Here one
program per (token, head) reads its position's cos/sin rows and the head's two halves
once and writes the rotated head over them, as the CPU kernel (``ops.rotary_embedding``)
does. Works on the joint query+key view the attention layer rotates (rows of the fused
QKV projection, so the token stride is the projection's width) and on a head's leading
``rotary_dim`` dimensions (partial rotary). Computed in float32, stored in the dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotary_kernel(
    positions_ptr,
    x_ptr,
    cos_ptr,
    sin_ptr,
    half,
    x_token_stride,
    x_head_stride,
    table_stride,
    BLOCK: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < half
    position = tl.load(positions_ptr + token)
    cos = tl.load(cos_ptr + position * table_stride + cols, mask=mask).to(tl.float32)
    sin = tl.load(sin_ptr + position * table_stride + cols, mask=mask).to(tl.float32)
    first_ptr = x_ptr + token * x_token_stride + head * x_head_stride + cols
    first = tl.load(first_ptr, mask=mask).to(tl.float32)
    second = tl.load(first_ptr + half, mask=mask).to(tl.float32)
    dtype = x_ptr.dtype.element_ty
    tl.store(first_ptr, (first * cos - second * sin).to(dtype), mask=mask)
    tl.store(first_ptr + half, (second * cos + first * sin).to(dtype), mask=mask)


def rotary_triton(
    positions: torch.Tensor, qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> None:
    """Rotate ``qk [tokens, heads, rotary_dim]`` (unit last stride) in place by the
    ``positions`` rows of the ``[rows, rotary_dim]`` tables (the halves repeat)."""
    if qk.dim() != 3 or qk.stride(-1) != 1 or qk.shape[-1] % 2:
        raise ValueError(f"expected [tokens, heads, even rotary_dim], got {tuple(qk.shape)}")
    if cos.shape != sin.shape or cos.shape[1] != qk.shape[-1] or cos.stride(1) != 1:
        raise ValueError(f"tables {tuple(cos.shape)} do not fit heads of {qk.shape[-1]}")
    if positions.shape != (qk.shape[0],):
        raise ValueError(f"{tuple(positions.shape)} positions for {qk.shape[0]} tokens")
    tokens, heads, rotary_dim = qk.shape
    if tokens and heads:
        half = rotary_dim // 2
        _rotary_kernel[(tokens, heads)](
            positions,
            qk,
            cos,
            sin,
            half,
            qk.stride(0),
            qk.stride(1),
            cos.stride(0),
            BLOCK=triton.next_power_of_2(half),
            num_warps=1,
        )
