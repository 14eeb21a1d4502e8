"""The top-p threshold search of ``top_p_threshold`` as one Triton kernel launch.

One program per row runs all ``BISECT_STEPS`` steps; each step sums the row's
probabilities above the candidate in ``BLOCK``-wide chunks (a vocabulary-sized float32
row stays in L2 between steps).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from octavo.sampling.top_p_threshold import BISECT_STEPS, ONE_BITS

BLOCK = 2048


@triton.jit
def _top_p_threshold_kernel(
    probs_ptr,
    top_p_ptr,
    out_ptr,
    vocab,
    row_stride,
    ONE: tl.constexpr,
    STEPS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    start_ptr = probs_ptr + row.to(tl.int64) * row_stride
    top_p = tl.load(top_p_ptr + row)
    low = tl.full((1,), -1, tl.int32)
    high = tl.full((1,), ONE, tl.int32)
    for _ in range(STEPS):
        middle = low + (high - low) // 2
        candidate = middle.to(tl.float32, bitcast=True)
        mass = tl.zeros((1,), tl.float32)
        for offset in range(0, vocab, BLOCK):
            cols = offset + tl.arange(0, BLOCK)
            values = tl.load(start_ptr + cols, mask=cols < vocab, other=0.0)
            mass += tl.sum(tl.where(values > candidate, values, 0.0), axis=0)
        small = mass < top_p
        high = tl.where(small, middle, high)
        low = tl.where(small, low, middle)
    tl.store(out_ptr + row + tl.arange(0, 1), high.to(tl.float32, bitcast=True))


def triton_thresholds(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """``top_p_threshold.top_p_thresholds`` for float32 ``probs`` with unit column stride."""
    if probs.dtype != torch.float32 or probs.dim() != 2 or probs.stride(1) != 1:
        raise ValueError(f"expected float32 [rows, vocab] probabilities, got {probs.dtype}")
    rows, vocab = probs.shape
    out = torch.empty(rows, dtype=torch.float32, device=probs.device)
    if rows:
        _top_p_threshold_kernel[(rows,)](
            probs,
            top_p.to(torch.float32).contiguous(),
            out,
            vocab,
            probs.stride(0),
            ONE=ONE_BITS,
            STEPS=BISECT_STEPS,
            BLOCK=BLOCK,
        )
    return out
