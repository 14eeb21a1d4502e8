"""Sampled rows on the CPU through one native kernel (``octavo_cpu.sample_rows``).

The torch path of ``Sampler`` makes several passes over the whole ``[rows, vocab]`` tensor
for a temperature draw (a copy, a division, a softmax, ``-log`` of a vocabulary of random
numbers per row, a product, an argmax), and its CPU top-p search widens to the whole
vocabulary on a flat row: at 32 rows of SmolLM2's 49,152 tokens that was 7.6 ms a step for
temperature alone and 64 ms with top-p, against about 30 ms for the model's step. The kernel
does a row's temperature, top-k, top-p, min-p and draw in one task over that row, in cache
(``kernels/csrc/sampling.cpp`` has the rules; they keep the tokens the torch filters keep).

The draw is the inverse CDF with one ``U[0, 1)`` number per row (``random_draws.row_uniforms``):
a seeded row's tokens still come from its own generator alone, whatever else is in the batch.
It is exact as the torch path's exponential race is, but not the same function of the seed:
a seed gives other tokens here than on a GPU or with the native kernels off.
"""

from __future__ import annotations

from typing import Any

import torch

from octavo.sampling.random_draws import row_uniforms


def native_sampling_ops(device: torch.device) -> Any | None:
    """The native ops when the kernel can sample on ``device`` (the CPU), else None."""
    from octavo.kernels.cpu_build import native_op_owner

    return native_op_owner(device, "sample_rows")


def draw_rows(ops: Any, logits: torch.Tensor, rows: list) -> torch.Tensor:
    """One token per row of float32 ``logits [rows, vocab]`` (``SamplingRow`` settings)."""
    params = [row.params for row in rows]
    out = torch.empty(len(rows), dtype=torch.long)
    ops.sample_rows(
        out,
        logits,
        torch.tensor([p.temperature for p in params], dtype=torch.float32),
        torch.tensor([p.top_k for p in params], dtype=torch.long),
        torch.tensor([p.top_p for p in params], dtype=torch.float32),
        torch.tensor([p.min_p for p in params], dtype=torch.float32),
        row_uniforms([row.generator for row in rows]),
    )
    return out


def argmax_indices(values: torch.Tensor, native: bool = True) -> torch.Tensor:
    """Index of each row's largest value of ``values [rows, n]``, the first on ties (a NaN
    counts as the largest), on ``values``' device: the native ``argmax_rows`` for float32
    CPU rows (``max(dim=-1)`` ran 4-8x slower there: 256 rows of SmolLM2's logits, 2 AVX2
    cores, 7-14 ms against 1.8), else ``max(dim=-1)``."""
    ops = _argmax_ops(values) if native else None
    if ops is None:
        return values.max(dim=-1).indices
    out = torch.empty(values.shape[0], dtype=torch.long)
    ops.argmax_rows(out, values)
    return out


def _argmax_ops(values: torch.Tensor) -> Any | None:
    from octavo.kernels.cpu_build import native_op_owner

    if values.dtype != torch.float32 or values.dim() != 2 or values.shape[1] == 0:
        return None
    if values.stride(-1) != 1:
        return None
    return native_op_owner(values.device, "argmax_rows")
