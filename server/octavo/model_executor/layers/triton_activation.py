"""Gated activations on GPU as one Triton kernel: ``act(gate) · up`` read from the fused
gate/up output and written once (the torch path reads and writes each half twice).

``kind``: ``silu``, ``gelu_tanh`` (Gemma's), ``clamped_swiglu`` (gpt-oss: alpha 1.702,
limit 7). Computed in float32, stored in the input's dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

KINDS = {"silu": 0, "gelu_tanh": 1, "clamped_swiglu": 2}
BLOCK = 1024


@triton.jit
def _gated_kernel(
    x_ptr, out_ptr, d, x_row_stride, out_row_stride, KIND: tl.constexpr, BLOCK: tl.constexpr
):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    gate = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_row_stride + d + cols, mask=mask, other=0.0).to(tl.float32)
    if KIND == 0:
        act = gate * tl.sigmoid(gate)
    elif KIND == 1:  # 0.5·g·(1 + tanh(y)) written as g·sigmoid(2y): no cancellation near -1
        inner = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        act = gate * tl.sigmoid(2.0 * inner)
    else:
        gate = tl.minimum(gate, 7.0)
        up = tl.minimum(tl.maximum(up, -7.0), 7.0) + 1.0
        act = gate * tl.sigmoid(1.702 * gate)
    out = act * up
    tl.store(out_ptr + row * out_row_stride + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def gated_activation_triton(x: torch.Tensor, kind: str) -> torch.Tensor:
    """``x [tokens, 2d]`` (gate, then up) → ``[tokens, d]``."""
    if kind not in KINDS:
        raise ValueError(f"unknown gated activation {kind!r}; known: {', '.join(KINDS)}")
    if x.dim() != 2 or x.shape[1] % 2 or x.stride(1) != 1:
        raise ValueError(f"expected [tokens, 2d] with unit column stride, got {tuple(x.shape)}")
    tokens, d = x.shape[0], x.shape[1] // 2
    out = torch.empty(tokens, d, dtype=x.dtype, device=x.device)
    if tokens:
        grid = (tokens, triton.cdiv(d, BLOCK))
        _gated_kernel[grid](x, out, d, x.stride(0), out.stride(0), KIND=KINDS[kind], BLOCK=BLOCK)
    return out
