"""A generated token's log-probability, rank and best alternatives, as the engine hands
them back (torch-free: the server's API process reads them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TokenLogprobs:
    """The chosen token's log-probability, its rank and the best alternatives."""

    token_id: int
    logprob: float
    rank: int  # 1-based rank of the chosen token among all tokens (1 = most likely)
    top: list[tuple[int, float]]  # up to `params.logprobs` (token_id, logprob), best first
