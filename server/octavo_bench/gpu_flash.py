"""FlashAttention-2 as torch ships it, the GPU bench's third attention candidate.

``--attention-backend FLASH_ATTN`` (``octavo/attention/flash_backend.py``) runs torch's
FlashAttention-2 (``torch.nn.attention.varlen.varlen_attn``) over the paged cache: every
sequence of a step in one launch. It needs no wheel beyond torch, where FlashInfer's would
not fit the GPU machine. Its one condition: cache pages of a multiple of 256 tokens, so each
row re-lays the same keys and values into 256-token blocks and times the backend's launch
alone, beside the Triton kernels on Octavo's blocks. The figures decide whether CUDA
serving should take blocks of 256 and this kernel by default.

A torch before 2.13 (the lent H200's 2.11 in November) has FA2 but reads no paged cache:
there the rows time FA2's varlen kernel over the same keys laid out contiguously per
sequence (``seqused_k`` of each, every query head group at once), the kernel the paged
launch runs with a page table of consecutive pages: ``flash_kind`` tells which was timed.
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
    """torch's FlashAttention-2 runs here: a CUDA GPU from Ampere (sm_80) on."""
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
    query: torch.Tensor, layout: FlashLayout, meta: AttentionMetadata, scale: float
) -> tuple[str, Callable[[], torch.Tensor]]:
    """``(kind, call)``: the FLASH_ATTN backend's launch for the step ``meta`` describes
    (every sequence of it) over ``layout``'s pages ("paged"), or where this torch reads no
    paged cache, FA2's varlen kernel over the same keys, contiguous ("contiguous")."""
    if paged_varlen_available():
        backend = FlashAttention(BENCH_MAX_POSITIONS)
        paged = replace(meta, block_tables=layout.block_tables, backend_cache={})
        return "paged", lambda: backend.attend(query, layout.cache, paged, scale)
    return "contiguous", contiguous_call(query, layout, meta, scale)


def contiguous_call(
    query: torch.Tensor, layout: FlashLayout, meta: AttentionMetadata, scale: float
) -> Callable[[], torch.Tensor]:
    """FA2's varlen kernel (``aten._flash_attention_forward``, in torch since 2.3) over the
    re-laid keys: sequence ``b``'s start ``b * pages_each * 256`` tokens into them, its
    first ``seq_lens[b]`` used; causal from the bottom right, grouped heads native."""
    seqs, pages_each = layout.block_tables.shape
    span = pages_each * FLASH_BLOCK
    keys, values = (part.flatten(0, 1) for part in layout.cache)  # [seqs * span, kv, dim]
    starts = torch.arange(seqs + 1, device=query.device, dtype=torch.int32) * span
    used = meta.seq_lens.to(torch.int32)
    longest_query = max(meta.query_lens_list)
    args = (query, keys, values, meta.query_start_loc, starts, longest_query, span, 0.0, True)

    def call() -> torch.Tensor:
        return flash_forward(*args, False, scale=scale, seqused_k=used)[0]

    return call


def flash_forward(*args, **kwargs):
    """``torch.ops.aten._flash_attention_forward`` (a seam: CPU tests stand in for it)."""
    return torch.ops.aten._flash_attention_forward(*args, **kwargs)
