"""The experts of one step, grouped by expert (the CPU path; no per-token Python loop).

The step's ``(token, expert)`` pairs are sorted by expert; the tokens are gathered once,
each active expert runs one GEMM over its contiguous run of rows, the rows are scaled by
their routing weights and summed back into their tokens with one ``index_add_``. The
pairs reach each token in ascending expert order, as in transformers' loop.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

ExpertFn = Callable[[int, torch.Tensor], torch.Tensor]  # (local expert, rows) -> rows out


def grouped_experts(
    hidden: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    num_local_experts: int,
    run_expert: ExpertFn,
    expert_map: torch.Tensor | None = None,
) -> torch.Tensor:
    """``hidden [T, H]``, ``topk_* [T, k]`` → the weighted sum of each token's experts
    (only this rank's experts where ``expert_map`` marks others ``-1``)."""
    expert_of_pair = topk_ids.reshape(-1)
    if expert_map is not None:
        expert_of_pair = expert_map.to(expert_of_pair.device)[expert_of_pair]
    token_of_pair = torch.arange(hidden.shape[0], device=hidden.device).repeat_interleave(
        topk_ids.shape[1]
    )
    weight_of_pair = topk_weights.reshape(-1)
    if expert_map is not None:
        here = expert_of_pair >= 0
        expert_of_pair, token_of_pair = expert_of_pair[here], token_of_pair[here]
        weight_of_pair = weight_of_pair[here]
    order = torch.argsort(expert_of_pair, stable=True)
    tokens = token_of_pair[order]
    rows = hidden.index_select(0, tokens)
    counts = torch.bincount(expert_of_pair, minlength=num_local_experts).tolist()
    outputs = torch.empty_like(rows)
    start = 0
    for expert, count in enumerate(counts):
        if count:
            outputs[start : start + count] = run_expert(expert, rows[start : start + count])
        start += count
    scaled = (outputs * weight_of_pair[order].unsqueeze(-1)).to(hidden.dtype)
    return torch.zeros_like(hidden).index_add_(0, tokens, scaled)
