"""FlashAttention-2 as torch ships it, the GPU bench's third attention candidate.

``--attention-backend FLASH_ATTN`` (``octavo/attention/flash_backend.py``) runs torch's
FlashAttention-2 (``torch.nn.attention.varlen.varlen_attn``) over the paged cache: every
sequence of a step in one launch. It needs no wheel beyond torch, where FlashInfer's would
not fit the GPU machine. Its one condition: cache pages of a multiple of 256 tokens, so each
row re-lays the same keys and values into 256-token blocks and times the backend's launch
alone, beside the Triton kernels on Octavo's blocks. The figures decide whether CUDA
serving should take blocks of 256 and this kernel by default.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from octavo.attention.flash_backend import FLASH_BLOCK, FlashAttention, paged_varlen_available
from octavo.attention.metadata import AttentionMetadata

# the longest context the engine would tell FA2 (the bench's --max-model-len 2048, plus 1)
BENCH_MAX_POSITIONS = 2049


@dataclass(frozen=True)
class FlashLayout:
    """The same keys and values in ``FLASH_BLOCK``-token blocks: ``cache`` [2, blocks,
    FLASH_BLOCK, kv_heads, head_dim], each sequence's blocks in a row of ``block_tables``."""

    cache: torch.Tensor
    block_tables: torch.Tensor  # [seqs, blocks each] int32


def flash_available(device: torch.device) -> bool:
    """torch's paged FlashAttention-2 runs here: a CUDA GPU from Ampere (sm_80) on, torch
    2.13 or newer (a lent GPU machine's own torch may be older: the rows then show "-")."""
    if device.type != "cuda" or not paged_varlen_available():
        return False
    return torch.cuda.get_device_capability(device) >= (8, 0)


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
    query: torch.Tensor, layout: FlashLayout, meta: AttentionMetadata, scale: float
) -> Callable[[], torch.Tensor]:
    """The FLASH_ATTN backend's launch for the step ``meta`` describes (every sequence of
    it), reading ``layout``'s pages instead of the step's own blocks."""
    backend = FlashAttention(BENCH_MAX_POSITIONS)
    paged = replace(meta, block_tables=layout.block_tables, backend_cache={})
    return lambda: backend.attend(query, layout.cache, paged, scale)
