"""What an encoder's step needs beyond a decoder's: each prompt as one bidirectional span,
and each row's token type (BERT's segment: 1 for the second text of a pair)."""

from __future__ import annotations

import torch

from octavo.pooling.params import PoolingParams
from octavo.scheduler.output import ScheduledSequence


def whole_prompt_spans(prefills: list[ScheduledSequence]) -> list[list[tuple[int, int]]]:
    """Per prefill chunk, the positions that attend both ways: all of it (the scheduler
    gives an encoder's prompt whole to one step)."""
    spans = []
    for seq in prefills:
        start = seq.num_computed_tokens
        spans.append([(start, start + seq.num_new_tokens)])
    return spans


def token_types(
    scheduled: list[ScheduledSequence],
    seq_starts: list[int],
    pooling_of: dict[int, PoolingParams],
    device: torch.device,
) -> torch.Tensor | None:
    """The step's rows' token types, or None when every row is type 0."""
    total = sum(seq.num_new_tokens for seq in scheduled)
    types: list[int] | None = None
    for first, seq in zip(seq_starts, scheduled, strict=True):
        params = pooling_of.get(seq.seq_id)
        given = None if params is None else params.token_type_ids
        if not given:
            continue
        types = types or [0] * total
        start = seq.num_computed_tokens
        types[first : first + seq.num_new_tokens] = given[start : start + seq.num_new_tokens]
    return None if types is None else torch.tensor(types, dtype=torch.long, device=device)
