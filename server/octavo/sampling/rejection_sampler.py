"""Verifying proposed tokens so that the output is distributed exactly as the target's.

Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): proposal ``x_i`` drawn
from the draft's ``q_i`` is accepted with probability ``min(1, p_i(x_i) / q_i(x_i))``
under the target's ``p_i`` (after the request's temperature, top-k/top-p and penalties);
at the first rejection the token is drawn from ``max(0, p_i - q_i)`` renormalised and the
rest are dropped; if every proposal is accepted, one bonus token is drawn from
``p_{k+1}``. Each emitted token is then distributed exactly as ``p`` would make it.
N-gram proposals are deterministic (``q`` is one-hot): accept with ``p_i(x_i)``, and a
rejection draws from ``p_i`` without ``x_i``. Greedy requests accept while the proposal
is the target's argmax, so their output is token-identical to decoding without
speculation.
"""

from __future__ import annotations

import torch


def verify_greedy(target_logits: torch.Tensor, proposed: list[int]) -> list[int]:
    """``target_logits [k + 1, vocab]``: the accepted proposals, then the target's token."""
    return keep_matching(target_logits.argmax(dim=-1).tolist(), proposed)


def keep_matching(best: list[int], proposed: list[int]) -> list[int]:
    """The proposals while they equal the target's choices ``best`` (k + 1 of them), then
    the target's choice at the first difference (or after the last proposal)."""
    emitted = []
    for position, token in enumerate(proposed):
        if best[position] != token:
            break
        emitted.append(token)
    emitted.append(best[len(emitted)])
    return emitted


def verify_sampled(
    target_probs: torch.Tensor,
    proposed: list[int],
    draft_probs: torch.Tensor | None,
    generator: torch.Generator | None = None,
) -> list[int]:
    """``target_probs [k + 1, vocab]`` (rows sum to 1); ``draft_probs [k, vocab]``, or None
    for a deterministic (n-gram) proposal. Returns 1..k+1 tokens."""
    emitted = []
    for position, token in enumerate(proposed):
        p = target_probs[position]
        q = _draft_row(draft_probs, position, token, p)
        accept = torch.clamp(p[token] / q[token], max=1.0)
        if _uniform(generator, p.device) < accept:
            emitted.append(token)
            continue
        residual = torch.clamp(p - q, min=0.0)
        emitted.append(_draw(residual, generator))
        return emitted
    emitted.append(_draw(target_probs[len(proposed)], generator))
    return emitted


def _draft_row(draft_probs, position: int, token: int, like: torch.Tensor) -> torch.Tensor:
    if draft_probs is not None:
        return draft_probs[position]
    one_hot = torch.zeros_like(like)
    one_hot[token] = 1.0
    return one_hot


def _uniform(generator: torch.Generator | None, device: torch.device) -> float:
    return float(torch.rand((), generator=generator, device=device))


def _draw(weights: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from unnormalised non-negative ``weights``."""
    return int(torch.multinomial(weights / weights.sum(), 1, generator=generator))
