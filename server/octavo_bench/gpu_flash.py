"""FlashAttention-2 as torch ships it, the GPU bench's third attention candidate.

``torch.nn.attention.varlen.varlen_attn`` (torch 2.13) runs the FlashAttention-2 kernels
built into torch over a paged cache: queries of any length per sequence (decode rows and
prefill chunks alike, causal from the bottom right), keys and values read through a block
table, grouped heads. It needs no wheel beyond torch, where FlashInfer's would not fit the
GPU machine. Its one condition: cache blocks of a multiple of 256 tokens (torch's
``mha_varlen_fwd`` refuses smaller pages), so each row re-lays the same keys and values into
256-token blocks and times the kernel alone, beside the Triton kernels on Octavo's blocks.
The figures decide whether CUDA serving should take blocks of 256 and this kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

FLASH_BLOCK = 256  # tokens per page torch's FlashAttention-2 takes (a multiple of 256)


@dataclass(frozen=True)
class FlashLayout:
    """The same keys and values in ``FLASH_BLOCK``-token blocks: ``cache`` [2, blocks,
    FLASH_BLOCK, kv_heads, head_dim], each sequence's blocks in a row of ``block_tables``."""

    cache: torch.Tensor
    block_tables: torch.Tensor  # [seqs, blocks each] int32


def flash_available(device: torch.device) -> bool:
    """torch's FlashAttention-2 runs on CUDA GPUs from Ampere (sm_80) on."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0)


def relay_cache(
    cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: list[int]
) -> FlashLayout:
    """Sequence ``i``'s first ``seq_lens[i]`` tokens, read through its row of
    ``block_tables`` from ``cache`` [2, blocks, block_size, kv_heads, head_dim], laid
    out again in blocks of ``FLASH_BLOCK`` (the last one padded with zeros)."""
    block_size = cache.shape[2]
    longest = -(-max(seq_lens) // FLASH_BLOCK) * FLASH_BLOCK
    positions = torch.arange(longest, device=cache.device)
    seen = positions.clamp(max=max(seq_lens) - 1)  # padding re-reads the last token...
    blocks = block_tables.long()[:, seen // block_size]  # [seqs, longest]
    tokens = cache[:, blocks, seen % block_size]  # [2, seqs, longest, kv_heads, head_dim]
    lengths = torch.tensor(seq_lens, device=cache.device)
    tokens[:, positions[None, :] >= lengths[:, None]] = 0  # ...and is zeroed
    per_seq = longest // FLASH_BLOCK
    relaid = tokens.reshape(2, len(seq_lens) * per_seq, FLASH_BLOCK, *cache.shape[3:])
    table = torch.arange(len(seq_lens) * per_seq, device=cache.device, dtype=torch.int32)
    return FlashLayout(relaid.contiguous(), table.view(len(seq_lens), per_seq))


def flash_attention_call(
    query: torch.Tensor,
    layout: FlashLayout,
    query_start_loc: torch.Tensor,
    seq_lens: list[int],
    scale: float,
) -> Callable[[], torch.Tensor]:
    """One ``varlen_attn`` launch over every sequence: ``query`` [tokens, heads, head_dim]
    in runs given by ``query_start_loc``, each the end of its ``seq_lens`` context."""
    from torch.nn.attention.varlen import varlen_attn

    device = query.device
    lengths = torch.tensor(seq_lens, device=device, dtype=torch.int32)
    starts_k = torch.zeros(len(seq_lens) + 1, device=device, dtype=torch.int32)
    starts_k[1:] = lengths.cumsum(0)
    starts_q = query_start_loc.to(device=device, dtype=torch.int32)
    longest_q = int((starts_q[1:] - starts_q[:-1]).max())
    keys, values = layout.cache[0], layout.cache[1]
    settings = dict(scale=scale, window_size=(-1, 0), enable_gqa=True)
    paging = dict(seqused_k=lengths, block_table=layout.block_tables)
    args = (query, keys, values, starts_q, starts_k, longest_q, max(seq_lens))
    return lambda: varlen_attn(*args, **settings, **paging)
