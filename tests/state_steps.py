"""A step's attention metadata as far as a state layer reads it, for the state-layer
tests (conv, Mamba2, gated DeltaNet) that drive a mixer without an engine."""

from __future__ import annotations

import torch

from octavo.attention.metadata import AttentionMetadata


def state_step_metadata(
    query_lens: list[int], seq_lens: list[int], slots: list[int], has_initial: list[bool]
) -> AttentionMetadata:
    """Sequences with more than one token first (prefill chunks), then single-token
    decodes: each one's new tokens, its length after the step, its slot and whether
    the slot holds its earlier tokens' state."""
    starts = [0]
    for length in query_lens:
        starts.append(starts[-1] + length)
    num_prefills = sum(1 for length in query_lens if length > 1)
    return AttentionMetadata(
        slot_mapping=torch.zeros(starts[-1], dtype=torch.long),
        block_tables=torch.zeros(len(query_lens), 1, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        num_prefills=num_prefills,
        num_prefill_tokens=starts[num_prefills],
        query_lens_list=query_lens,
        query_start_loc_list=starts[:-1],
        seq_lens_list=seq_lens,
        max_seq_len=max(seq_lens),
        state_slots=torch.tensor(slots, dtype=torch.long),
        state_has_initial=torch.tensor(has_initial, dtype=torch.bool),
    )
