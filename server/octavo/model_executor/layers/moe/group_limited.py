"""DeepSeek's expert selection: group-limited top-k and the score-correction bias.

The experts form ``num_groups`` equal groups. Each token first keeps its ``top_groups``
best groups (a group's score: its best expert's score, DeepSeek-V2's
``group_limited_greedy``, or the sum of its two best, DeepSeek-V3's), then takes its
top-k experts among them. DeepSeek-V3 adds ``e_score_correction_bias`` to the scores
for this choice only: the routing weights are the unbiased scores of the chosen experts.
Computed as transformers' ``DeepseekV2TopkRouter`` / ``DeepseekV3TopkRouter`` do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GROUP_SCORES = ("max", "top2_sum")


@dataclass(frozen=True)
class GroupLimit:
    num_groups: int  # n_group
    top_groups: int  # topk_group
    score: str  # "max" (DeepSeek-V2) or "top2_sum" (DeepSeek-V3)

    def __post_init__(self) -> None:
        if self.score not in GROUP_SCORES:
            raise ValueError(f"unknown group score {self.score!r}; supported: {GROUP_SCORES}")
        if not 0 < self.top_groups <= self.num_groups:
            raise ValueError(f"topk_group {self.top_groups} must be in 1..n_group")


@dataclass(frozen=True)
class Selection:
    """How a router beyond plain top-k picks experts and scales their weights."""

    group_limit: GroupLimit | None = None
    correction_bias: bool = False  # e_score_correction_bias, for the choice only (V3)
    scaling_factor: float = 1.0  # routed_scaling_factor: multiplies the final weights
    float32_logits: bool = False  # logits from float32 hidden states and weight (DeepSeek)


PLAIN_SELECTION = Selection()


def limit_to_groups(scores: torch.Tensor, limit: GroupLimit, fill: float) -> torch.Tensor:
    """``scores [T, E]`` with every expert outside a token's best groups set to ``fill``
    (0 for V2's softmax scores, -inf for V3's biased sigmoid scores)."""
    tokens, experts = scores.shape
    grouped = scores.view(tokens, limit.num_groups, experts // limit.num_groups)
    if limit.score == "max":
        group_scores = grouped.max(dim=-1).values
    else:
        group_scores = grouped.topk(2, dim=-1)[0].sum(dim=-1)
    best = torch.topk(group_scores, k=limit.top_groups, dim=-1, sorted=False)[1]
    keep = torch.zeros_like(group_scores).scatter_(1, best, 1).bool()
    keep = keep.unsqueeze(-1).expand_as(grouped).reshape(tokens, experts)
    return scores.masked_fill(~keep, fill)


def select_experts(
    scores: torch.Tensor, top_k: int, selection: Selection, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights [T, k], ids [T, k])`` from ``scores [T, E]`` (softmax or sigmoid, fp32):
    the choice from the (biased, group-limited) scores, the weights from ``scores``."""
    for_choice = scores if bias is None else scores + bias.float()
    if selection.group_limit is not None:
        fill = 0.0 if bias is None else float("-inf")
        for_choice = limit_to_groups(for_choice, selection.group_limit, fill)
    if bias is None:  # V2: the weights are the chosen (group-limited) scores themselves
        values, ids = torch.topk(for_choice, k=top_k, dim=-1, sorted=False)
        return values, ids
    ids = torch.topk(for_choice, k=top_k, dim=-1, sorted=False)[1]
    return scores.gather(1, ids), ids
