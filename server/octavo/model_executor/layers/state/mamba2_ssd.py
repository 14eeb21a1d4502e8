"""Mamba2's selective state-space scan (SSD), the torch reference.

Per head ``h`` the state ``S [head_dim, state_size]`` evolves token by token as
``S = exp(dt · A) · S + dt · x ⊗ B`` and each token reads ``y = S · C`` (the ``D · x``
skip is the caller's). ``B`` and ``C`` belong to groups of heads (``n_groups``): head
``h`` reads group ``h // (heads / n_groups)``.

A prefill chunk runs in the chunked (SSD) form, as transformers and mamba_ssm compute it:
within each block of ``block`` tokens an attention-like masked product, across blocks a
short recurrence over the block states, starting from the sequence's saved state. A
decode is one step of the recurrence for every decoding sequence at once. Everything is
computed in float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class ScanInputs:
    """One sequence's (or a batch of decodes') inputs, already discretised in time."""

    x: torch.Tensor  # [tokens, heads, head_dim]
    dt: torch.Tensor  # [tokens, heads], after softplus and the time-step limit
    A: torch.Tensor  # [heads], negative
    B: torch.Tensor  # [tokens, groups, state_size]
    C: torch.Tensor  # [tokens, groups, state_size]


def _per_head(groups: torch.Tensor, heads: int) -> torch.Tensor:
    """``[..., groups, n]`` → ``[..., heads, n]``: each group repeated for its heads."""
    return groups.repeat_interleave(heads // groups.shape[-2], dim=-2)


def _blocked(tensor: torch.Tensor, block: int) -> torch.Tensor:
    """``[tokens, ...]`` zero-padded to whole blocks → ``[blocks, block, ...]``."""
    pad = -tensor.shape[0] % block
    if pad:
        tensor = torch.cat([tensor, tensor.new_zeros(pad, *tensor.shape[1:])])
    return tensor.view(-1, block, *tensor.shape[1:])


def _segment_sums(decay: torch.Tensor) -> torch.Tensor:
    """``decay [..., block]`` → ``[..., block, block]``: entry ``[l, s]`` is the sum of
    ``decay`` over positions ``(s, l]`` for ``s <= l`` and ``-inf`` above the diagonal
    (summed as masked cumulative sums, not as differences of two long sums)."""
    block = decay.shape[-1]
    below = torch.ones(block, block, dtype=torch.bool, device=decay.device).tril(-1)
    repeated = decay.unsqueeze(-1).expand(*decay.shape, block).masked_fill(~below, 0.0)
    sums = repeated.cumsum(dim=-2)
    causal = torch.ones(block, block, dtype=torch.bool, device=decay.device).tril()
    return sums.masked_fill(~causal, float("-inf"))


def ssd_prefill(
    inputs: ScanInputs, initial_state: torch.Tensor, block: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's chunk, continuing ``initial_state [heads, head_dim, state_size]``
    → (``y [tokens, heads, head_dim]``, the state after its last token)."""
    tokens, heads = inputs.dt.shape
    x = _blocked(inputs.x.float() * inputs.dt.float()[..., None], block)  # [c, l, h, p]
    B = _blocked(_per_head(inputs.B.float(), heads), block)  # [c, l, h, n]
    C = _blocked(_per_head(inputs.C.float(), heads), block)
    decay = _blocked(inputs.dt.float() * inputs.A.float(), block).permute(0, 2, 1)  # [c, h, l]
    cumulative = decay.cumsum(dim=-1)
    within = torch.exp(_segment_sums(decay))  # [c, h, l, s]
    scores = torch.einsum("clhn,cshn->chls", C, B) * within
    y = torch.einsum("chls,cshp->clhp", scores, x)
    to_end = torch.exp(cumulative[..., -1:] - cumulative)  # [c, h, l]
    block_states = torch.einsum("clhn,chl,clhp->chpn", B, to_end, x)
    starts, final = _block_starts(initial_state.float(), block_states, cumulative[..., -1])
    from_start = torch.exp(cumulative)  # [c, h, l]
    y = y + torch.einsum("clhn,chpn,chl->clhp", C, starts, from_start)
    return y.reshape(-1, heads, x.shape[-1])[:tokens], final


def _block_starts(
    initial: torch.Tensor, block_states: torch.Tensor, block_decay: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The state entering each block ``[c, h, p, n]`` and the one after the last, from
    each block's own contribution and its total decay ``[c, h]``."""
    starts, state = [], initial
    for index in range(block_states.shape[0]):
        starts.append(state)
        state = torch.exp(block_decay[index])[:, None, None] * state + block_states[index]
    return torch.stack(starts), state


def ssd_decode(inputs: ScanInputs, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token for each of ``seqs`` sequences: ``states [seqs, heads, head_dim,
    state_size]`` → (``y [seqs, heads, head_dim]``, the new states)."""
    heads = inputs.dt.shape[1]
    dt = inputs.dt.float()
    B = _per_head(inputs.B.float(), heads)  # [s, h, n]
    C = _per_head(inputs.C.float(), heads)
    decay = torch.exp(dt * inputs.A.float())[..., None, None]  # [s, h, 1, 1]
    update = (dt[..., None] * inputs.x.float())[..., None] * B[:, :, None, :]
    states = states.float() * decay + update
    y = torch.einsum("shpn,shn->shp", states, C)
    return y, states


def discretize_dt(
    dt: torch.Tensor, dt_bias: torch.Tensor, limit: tuple[float, float]
) -> torch.Tensor:
    """The raw time-step projection → ``softplus(dt + dt_bias)`` within ``limit``."""
    dt = F.softplus(dt.float() + dt_bias.float())
    if limit == (0.0, float("inf")):
        return dt
    return dt.clamp(min=limit[0], max=limit[1])
