"""State layers' plumbing: the varlen causal conv1d with per-slot state."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from octavo.attention.metadata import AttentionMetadata
from octavo.model_executor.layers.state.causal_conv1d import causal_conv1d

CHANNELS, KERNEL, NUM_SLOTS = 6, 4, 8


def state_meta(
    query_lens: list[int], slots: list[int], has_initial: list[bool]
) -> AttentionMetadata:
    """A step's metadata as far as a state layer reads it: sequences with more than one
    token first (prefill chunks), then single-token decodes."""
    num_prefills = sum(1 for length in query_lens if length > 1)
    starts = [0]
    for length in query_lens:
        starts.append(starts[-1] + length)
    return AttentionMetadata(
        slot_mapping=torch.zeros(starts[-1], dtype=torch.long),
        block_tables=torch.zeros(len(query_lens), 1, dtype=torch.int32),
        seq_lens=torch.tensor(query_lens, dtype=torch.int32),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        num_prefills=num_prefills,
        num_prefill_tokens=starts[num_prefills],
        query_lens_list=query_lens,
        query_start_loc_list=starts[:-1],
        seq_lens_list=query_lens,
        max_seq_len=max(query_lens),
        state_slots=torch.tensor(slots, dtype=torch.long),
        state_has_initial=torch.tensor(has_initial),
    )


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """One whole sequence ``x [length, channels]`` through a zero-padded causal conv."""
    out = F.conv1d(x.t()[None], weight[:, None], bias, padding=KERNEL - 1, groups=CHANNELS)
    return out[0, :, : x.shape[0]].t()


def test_causal_conv1d_chunks_and_decodes_match_whole_sequences() -> None:
    """Three sequences of lengths 7, 2 and 5 go through in pieces (chunks shorter and
    longer than the kernel, then decodes batched beside a chunk): each piece's output
    equals the same rows of the whole sequence's conv; a stale slot is ignored when the
    sequence has no initial state."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(CHANNELS, KERNEL, generator=generator)
    bias = torch.randn(CHANNELS, generator=generator)
    seqs = [torch.randn(n, CHANNELS, generator=generator) for n in (7, 2, 5)]
    state = torch.randn(NUM_SLOTS, CHANNELS, KERNEL - 1, generator=generator)  # stale
    slots = [3, 5, 1]
    steps = [  # per step: (sequence, start, length), prefill chunks before decodes
        [(0, 0, 2), (1, 0, 2)],
        [(0, 2, 3), (2, 0, 4), (1, 2, 0)],
        [(0, 5, 1), (2, 4, 1)],
        [(0, 6, 1)],
    ]
    done = [0, 0, 0]
    for step in steps:
        pieces = [(i, start, n) for i, start, n in step if n]
        meta = state_meta(
            [n for _, _, n in pieces],
            [slots[i] for i, _, _ in pieces],
            [s > 0 for _, s, _ in pieces],
        )
        x = torch.cat([seqs[i][start : start + n] for i, start, n in pieces])
        out = causal_conv1d(x, weight, bias, state, meta, activation="silu")
        expected = torch.cat(
            [F.silu(reference(seqs[i], weight, bias))[s : s + n] for i, s, n in pieces]
        )
        torch.testing.assert_close(out, expected)
        for i, _, n in pieces:
            done[i] += n
    assert done == [7, 2, 5]
    for i, seq in enumerate(seqs):  # each slot keeps the sequence's last kernel-1 inputs
        padded = torch.cat([torch.zeros(KERNEL - 1, CHANNELS), seq])
        torch.testing.assert_close(state[slots[i]], padded[-(KERNEL - 1) :].t())
    assert state[0].abs().sum() > 0  # untouched rows keep what they held
