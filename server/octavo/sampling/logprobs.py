"""Log-probabilities reported back to the client for each generated token.

They are taken from the raw model logits (before penalties, temperature and
filtering), which is what vLLM reports by default.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TokenLogprobs:
    """The chosen token's log-probability, its rank and the best alternatives."""

    token_id: int
    logprob: float
    rank: int  # 1-based rank of the chosen token among all tokens (1 = most likely)
    top: list[tuple[int, float]]  # up to `params.logprobs` (token_id, logprob), best first


def raw_logprobs(logits: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """Return float32 ``log_softmax`` of the given rows of the unmodified logits."""
    if len(rows) < logits.shape[0]:
        logits = logits[torch.tensor(rows, dtype=torch.long, device=logits.device)]
    return torch.log_softmax(logits.float(), dim=-1)


def gather_logprobs(
    logprobs: torch.Tensor, chosen: list[int], num_top: list[int]
) -> list[TokenLogprobs]:
    """Build one ``TokenLogprobs`` per row of ``logprobs``.

    ``chosen[i]`` is the token sampled for row ``i`` and ``num_top[i]`` how many top
    alternatives that row wants (0 = none).
    """
    chosen_t = torch.tensor(chosen, dtype=torch.long, device=logprobs.device).unsqueeze(1)
    chosen_lp = logprobs.gather(1, chosen_t)
    ranks = ((logprobs > chosen_lp).sum(dim=1, dtype=torch.int32) + 1).tolist()  # 2x int64's
    chosen_values = chosen_lp.squeeze(1).tolist()
    widest = max(num_top, default=0)
    top_ids: list[list[int]] = [[] for _ in chosen]
    top_values: list[list[float]] = [[] for _ in chosen]
    if widest > 0:
        values, indices = logprobs.topk(widest, dim=1, sorted=True)
        top_ids, top_values = indices.tolist(), values.tolist()
    return [
        TokenLogprobs(
            token_id=token_id,
            logprob=chosen_values[i],
            rank=ranks[i],
            top=list(zip(top_ids[i][: num_top[i]], top_values[i][: num_top[i]], strict=True)),
        )
        for i, token_id in enumerate(chosen)
    ]
