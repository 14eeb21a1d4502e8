"""A varlen causal depthwise conv1d whose last ``kernel - 1`` inputs persist per sequence.

The step's tokens are flat (``AttentionMetadata``): sequence ``i`` owns rows
``query_start_loc[i]:query_start_loc[i + 1]`` and the state slot ``state_slots[i]``.
Each sequence's input is its slot's saved inputs (zeros when ``state_has_initial`` is
False) followed by its new tokens; the slot then keeps the last ``kernel - 1`` of them,
so a prefill split over several chunks computes what one whole prefill would.

This torch path is the reference (and the CPU path): decodes go in one batched conv,
prefill chunks one sequence at a time.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from octavo.attention.metadata import AttentionMetadata


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_state: torch.Tensor,
    meta: AttentionMetadata,
    activation: str | None = None,
) -> torch.Tensor:
    """``x [tokens, channels]``, ``weight [channels, kernel]``, ``conv_state [num_slots,
    channels, kernel - 1]`` (updated in place) → ``[tokens, channels]``."""
    slots = meta.state_slots
    history = _initial_history(conv_state, slots, meta.state_has_initial).to(weight.dtype)
    inputs = x.to(weight.dtype)
    out = torch.empty_like(inputs)
    new_history = torch.empty_like(history)
    num_prefills = meta.num_prefills
    for i in range(num_prefills):
        start = meta.query_start_loc_list[i]
        rows = slice(start, start + meta.query_lens_list[i])
        out[rows], new_history[i] = _conv_sequence(inputs[rows], history[i], weight, bias)
    if meta.num_decodes:
        rows = slice(meta.num_prefill_tokens, None)
        out[rows], new_history[num_prefills:] = _conv_decodes(
            inputs[rows], history[num_prefills:], weight, bias
        )
    conv_state.index_copy_(0, slots, new_history.to(conv_state.dtype))
    return _activate(out, activation).to(x.dtype)


def _initial_history(
    conv_state: torch.Tensor, slots: torch.Tensor, has_initial: torch.Tensor | None
) -> torch.Tensor:
    """``[num_seqs, channels, kernel - 1]``: each slot's saved inputs, zeros where the
    sequence starts fresh (without reading a flag back to the host)."""
    history = conv_state.index_select(0, slots)
    if has_initial is None:
        return history
    return history * has_initial.view(-1, 1, 1).to(history.dtype)


def _conv_sequence(
    tokens: torch.Tensor, history: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's ``tokens [length, channels]`` after ``history [channels, kernel - 1]``
    → (outputs ``[length, channels]``, the new history)."""
    full = torch.cat([history, tokens.t()], dim=-1)
    out = F.conv1d(full.unsqueeze(0), weight.unsqueeze(1), bias, groups=weight.shape[0])
    return out[0].t(), full[:, full.shape[-1] - history.shape[-1] :]


def _conv_decodes(
    tokens: torch.Tensor, history: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence, batched: ``tokens [seqs, channels]``, ``history [seqs,
    channels, kernel - 1]`` → (outputs ``[seqs, channels]``, the new histories)."""
    full = torch.cat([history, tokens.unsqueeze(-1)], dim=-1)
    out = F.conv1d(full, weight.unsqueeze(1), bias, groups=weight.shape[0])
    return out[:, :, 0], full[:, :, 1:]


def _activate(out: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation is None:
        return out
    if activation in ("silu", "swish"):
        return F.silu(out)
    raise ValueError(f"causal_conv1d: unsupported activation {activation!r}")
