"""Logit adjustments that depend on what a sequence has generated or seen so far.

All functions change a contiguous float32 ``[batch, vocab]`` logits tensor in place.
Penalties only touch the tokens that occur in a history, so their cost grows with the
number of history tokens, not with ``batch * vocab``: every ``(row, token)`` pair is
turned into a flat index ``row * vocab + token`` and the batch is handled in one go
(no ``torch.unique``, which is slow on CPU: duplicates are handled by how they are
written back, see the comments below).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np
import torch

from octavo.sampling.host_lists import device_tensor, to_device


def apply_repetition_penalty(
    logits: torch.Tensor,
    rows: Sequence[int],
    histories: Sequence[Sequence[int]],
    penalties: Sequence[float],
) -> None:
    """Make tokens seen in ``histories[i]`` less likely in row ``rows[i]`` (HF convention).

    A positive logit is divided by the penalty and a negative one multiplied by it, so a
    penalty > 1 always lowers the logit (and < 1 raises it). Each token counts once.
    """
    flat_index = _flat_indices(logits, rows, histories)
    if flat_index is None:
        return
    factor = _per_row(logits, rows, penalties, default=1.0)[flat_index // logits.shape[1]]
    flat = logits.view(-1)
    values = flat[flat_index]
    # A token seen twice is written twice with the same value, so it is penalised once.
    flat[flat_index] = torch.where(values > 0, values / factor, values * factor)


def apply_presence_frequency_penalties(
    logits: torch.Tensor,
    rows: Sequence[int],
    outputs: Sequence[Sequence[int]],
    presence: Sequence[float],
    frequency: Sequence[float],
) -> None:
    """Subtract ``presence * (count > 0) + frequency * count`` in row ``rows[i]``.

    ``count`` is how often a token occurs in ``outputs[i]`` (generated tokens only).
    """
    flat_index = _flat_indices(logits, rows, outputs)
    if flat_index is None:
        return
    row_of = flat_index // logits.shape[1]
    presence_t = _per_row(logits, rows, presence, default=0.0)[row_of]
    frequency_t = _per_row(logits, rows, frequency, default=0.0)[row_of]
    flat = logits.view(-1)
    # Plain assignment: repeated tokens write the same value, so presence applies once.
    flat[flat_index] = flat[flat_index] - presence_t
    # Accumulation: every occurrence subtracts the frequency penalty once more.
    flat.index_put_((flat_index,), -frequency_t, accumulate=True)


def mask_tokens(logits: torch.Tensor, row: int, token_ids: Sequence[int]) -> None:
    """Set ``logits[row, token_ids]`` to -inf so those tokens can never be picked."""
    mask_token_rows(logits, [row], [token_ids])


def mask_token_rows(
    logits: torch.Tensor, rows: Sequence[int], token_ids: Sequence[Sequence[int]]
) -> None:
    """Set ``logits[rows[i], token_ids[i]]`` to -inf for every ``i``: one write."""
    vocab_size = logits.shape[1]
    for ids in token_ids:
        if ids and (min(ids) < 0 or max(ids) >= vocab_size):
            raise ValueError(f"token ids to block must be in [0, {vocab_size}), got {list(ids)}")
    flat_index = _flat_indices(logits, rows, token_ids)
    if flat_index is not None:  # index_fill_: ``[index] = scalar`` copies it over (a sync)
        logits.view(-1).index_fill_(0, flat_index, float("-inf"))


def _flat_indices(
    logits: torch.Tensor, rows: Sequence[int], histories: Sequence[Sequence[int]]
) -> torch.Tensor | None:
    """``row * vocab + token`` for every token of every history (``None`` if all empty)."""
    lengths = [len(ids) for ids in histories]
    if sum(lengths) == 0:
        return None
    vocab_size = logits.shape[1]
    flat = np.fromiter(chain.from_iterable(histories), dtype=np.int64, count=sum(lengths))
    token_ids = torch.from_numpy(flat)  # 2x faster than torch.tensor(list) for long histories
    if int(token_ids.min()) < 0 or int(token_ids.max()) >= vocab_size:
        raise ValueError(f"token ids in a sequence's history must be in [0, {vocab_size})")
    row_ids = torch.repeat_interleave(torch.tensor(list(rows)), torch.tensor(lengths))
    return to_device(row_ids * vocab_size + token_ids, logits.device)


def _per_row(
    logits: torch.Tensor, rows: Sequence[int], values: Sequence[float], default: float
) -> torch.Tensor:
    """A ``[batch]`` float32 tensor holding ``values[i]`` at ``rows[i]``, else ``default``."""
    full = torch.full((logits.shape[0],), default, dtype=torch.float32, device=logits.device)
    index = device_tensor(rows, torch.long, logits.device)
    full[index] = device_tensor(values, torch.float32, logits.device)
    return full
