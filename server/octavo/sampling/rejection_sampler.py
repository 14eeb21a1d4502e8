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

from octavo.sampling.random_draws import race, uniform


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
    for a deterministic (n-gram) proposal. Returns 1..k+1 tokens.

    All k acceptance tests are drawn at once (one read back from the device), then one
    token from the first rejected position's residual, or the bonus from ``p_{k+1}``."""
    if not proposed:
        return [_draw(target_probs[0], generator)]
    tokens = torch.tensor(proposed, dtype=torch.long, device=target_probs.device)
    draft = _draft_rows(draft_probs, tokens, target_probs)
    accepted = _acceptance(target_probs[: len(proposed)], draft, tokens, generator).tolist()
    kept = accepted.index(False) if False in accepted else len(proposed)
    if kept == len(proposed):
        return [*proposed, _draw(target_probs[kept], generator)]
    residual = torch.clamp(target_probs[kept] - draft[kept], min=0.0)
    return [*proposed[:kept], _draw(residual, generator)]


def _draft_rows(
    draft_probs: torch.Tensor | None, tokens: torch.Tensor, target_probs: torch.Tensor
) -> torch.Tensor:
    """``q [k, vocab]``: the draft's distributions, or one-hot rows for n-gram proposals."""
    if draft_probs is not None:
        return draft_probs
    one_hot = torch.zeros(
        (len(tokens), target_probs.shape[1]), dtype=target_probs.dtype, device=tokens.device
    )
    return one_hot.scatter_(1, tokens.unsqueeze(1), 1.0)


def _acceptance(
    p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor, generator: torch.Generator | None
) -> torch.Tensor:
    """Whether each proposal passes its test ``U < min(1, p(x) / q(x))`` (a bool tensor)."""
    index = tokens.unsqueeze(1)
    ratio = torch.clamp(p.gather(1, index) / q.gather(1, index), max=1.0).squeeze(1)
    return uniform((len(tokens),), generator, p.device) < ratio


def _draw(weights: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from the unnormalised non-negative ``weights [vocab]``."""
    return int(race(weights.unsqueeze(0), [generator])[0])
