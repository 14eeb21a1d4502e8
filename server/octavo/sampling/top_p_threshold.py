"""Exact top-p thresholds on an accelerator: no sort, no data-dependent loop, no host sync.

Top-p keeps a token of probability ``q`` exactly when the tokens strictly more likely
than it hold less than ``p`` of the mass, ``S(> q) < p`` (the sort-based rule, ties with
the last kept token included: a tie group is kept when the mass before its first member
is < p). ``S(> x)`` only grows as ``x`` falls, so the kept tokens are those with
``q >= t``, ``t`` the smallest float32 with ``S(> t) < p``. Non-negative float32 values
order like their int32 bit patterns, so ``t`` is found by bisecting on the bits between
-1 (below 0.0) and the bits of 1.0: a fixed ``BISECT_STEPS`` steps, each one masked sum
over the vocabulary for all rows at once, give the exact float. (The masses are summed
in another order than a sorted cumsum, so a row whose mass lands within rounding of
``p`` may keep one token more or less than the CPU path.)

On CUDA one Triton program per row does the whole search (``top_p_triton``); elsewhere
(and without Triton) ``bisect_thresholds`` does it with torch ops.
"""

from __future__ import annotations

import torch

ONE_BITS = 0x3F800000  # float32 1.0 as int32: no probability is larger
BISECT_STEPS = ONE_BITS.bit_length()  # 2**30 > ONE_BITS + 1: the bracket shrinks to one bit


def top_p_thresholds(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """``[rows]`` thresholds: row ``i`` keeps ``probs[i] >= t[i]`` (top-p ``top_p[i]``).

    ``probs`` is ``[rows, vocab]`` float32 (rows sum to ~1), ``top_p`` ``[rows]`` float32.
    """
    if probs.is_cuda:
        try:
            from octavo.sampling.top_p_triton import triton_thresholds
        except ImportError:  # no Triton: the torch ops below give the same thresholds
            return bisect_thresholds(probs, top_p)
        return triton_thresholds(probs, top_p)
    return bisect_thresholds(probs, top_p)


def bisect_thresholds(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The bisection of the module doc in torch ops (``BISECT_STEPS`` masked sums)."""
    rows = probs.shape[0]
    low = torch.full((rows,), -1, dtype=torch.int32, device=probs.device)  # S(> x) >= p
    high = torch.full((rows,), ONE_BITS, dtype=torch.int32, device=probs.device)  # < p
    zero = probs.new_zeros(())
    for _ in range(BISECT_STEPS):
        middle = low + (high - low) // 2  # >= 0 while high - low >= 2
        candidate = middle.view(torch.float32).unsqueeze(1)
        mass_above = torch.where(probs > candidate, probs, zero).sum(dim=1)
        small = mass_above < top_p
        high = torch.where(small, middle, high)
        low = torch.where(small, low, middle)
    return high.view(torch.float32)
