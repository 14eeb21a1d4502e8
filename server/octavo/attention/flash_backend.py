"""GPU attention backend ``FLASH_ATTN``: torch's FlashAttention-2 over the paged cache.

``torch.nn.attention.varlen.varlen_attn`` (torch 2.13) runs FlashAttention-2's kernels,
built into torch, over a paged cache: every sequence of a step (prefill chunks and decode
rows alike) in one launch, causal from the bottom right, grouped heads, keys and values read
through the block table. Its pages must hold a multiple of 256 tokens (``--block-size 256``:
``check_flash_attention``). The step's keys and values are stored with the Triton store
kernel first, as ``TritonAttention`` does.

A sliding-window layer (Mistral, Gemma 2/3, gpt-oss, Phi-3) runs FA2 with its window
(``window_size``: the query and the ``sliding_window - 1`` keys before it). A layer or step
the kernel does not cover goes to the Triton kernels unchanged: layer options FA2 has no
argument for in ``varlen_attn`` (soft-cap, sinks, chunked attention), an fp8 cache, heads
FA2 does not take (over 256 dimensions, or not a multiple of 8), an image's bidirectional
spans, an encoder's step. The longest context FA2 is told is the model's
longest (``max_positions``), as ``flash_attn_with_kvcache`` is told the cache's capacity:
FA2 plans its split of the keys from that length, so a CUDA graph captured on a short step
replays exactly at any context, and an eager step splits as a replay does (the same output
with and without graphs).
"""

from __future__ import annotations

import torch

from octavo.attention import triton_kernels
from octavo.attention.kv_quant import UNIT_SCALES, KVScales
from octavo.attention.metadata import AttentionMetadata
from octavo.attention.options import FULL_ATTENTION, AttentionOptions
from octavo.attention.triton_backend import TritonAttention

FLASH_BLOCK = 256  # torch's FlashAttention-2 takes pages of a multiple of this many tokens


def paged_varlen_available() -> bool:
    """Whether this torch's ``varlen_attn`` reads a paged cache (``block_table``: torch 2.13;
    2.11's took contiguous keys only)."""
    import inspect

    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return False
    return "block_table" in inspect.signature(varlen_attn).parameters


def check_flash_attention(device: torch.device, block_size: int, dtype: torch.dtype) -> None:
    """ValueError unless ``FLASH_ATTN`` can run here: a CUDA GPU from Ampere on, pages of a
    multiple of 256 tokens, a 16-bit model."""
    if device.type != "cuda":
        raise ValueError("attention_backend FLASH_ATTN runs on CUDA GPUs only")
    if not paged_varlen_available():
        raise ValueError(
            f"attention_backend FLASH_ATTN needs torch 2.13 or newer (paged "
            f"torch.nn.attention.varlen.varlen_attn); this is torch {torch.__version__}"
        )
    if torch.cuda.get_device_capability(device) < (8, 0):
        raise ValueError("attention_backend FLASH_ATTN needs an Ampere or newer GPU (sm_80+)")
    if block_size % FLASH_BLOCK:
        raise ValueError(
            f"attention_backend FLASH_ATTN (torch's FlashAttention-2) reads the KV cache in "
            f"pages of a multiple of {FLASH_BLOCK} tokens: add --block-size {FLASH_BLOCK} "
            f"(got {block_size})"
        )
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(
            f"attention_backend FLASH_ATTN needs --dtype bfloat16 or float16, not {dtype}"
        )


class FlashAttention(TritonAttention):
    """Stores the step's keys/values, then one FlashAttention-2 launch for every sequence."""

    def __init__(self, max_positions: int) -> None:
        self.max_positions = max_positions  # the longest context any step may have

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        kv_scales: KVScales = UNIT_SCALES,
        options: AttentionOptions = FULL_ATTENTION,
    ) -> torch.Tensor:
        """Attention output ``[T, heads, head_dim]``, the Triton backend's where FA2 does
        not apply (``covers``)."""
        if not self.covers(query, kv_cache, meta, options):
            return super().forward(query, key, value, kv_cache, meta, scale, kv_scales, options)
        triton_kernels.store_kv(key, value, kv_cache, meta.slot_mapping, kv_scales)
        return self.attend(query, kv_cache, meta, scale, options.sliding_window)

    @staticmethod
    def covers(
        query: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        options: AttentionOptions,
    ) -> bool:
        """Causal attention, plain or in a sliding window, over a cache of the query's dtype
        in pages FA2 takes, heads of at most 256 dimensions in multiples of 8."""
        head_dim = query.shape[-1]
        return (
            options.is_causal_window_at_most
            and head_dim <= 256
            and head_dim % 8 == 0
            and kv_cache.dtype == query.dtype
            and kv_cache.shape[2] % FLASH_BLOCK == 0
            and not meta.bidirectional_spans
            and not meta.encoder_only
        )

    def attend(
        self,
        query: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        window: int | None = None,
    ) -> torch.Tensor:
        """One ``varlen_attn`` launch: each sequence's queries (``query_start_loc``) over its
        ``seq_lens`` cached tokens, read through its block table row; with a ``window``, over
        the last ``window`` positions up to each query (itself included)."""
        from torch.nn.attention.varlen import varlen_attn

        key_starts = meta.backend_cache.get("flash_key_starts")
        if key_starts is None:  # once a step (a captured graph records it once too)
            key_starts = torch.zeros_like(meta.query_start_loc)
            torch.cumsum(meta.seq_lens, 0, dtype=key_starts.dtype, out=key_starts[1:])
            meta.backend_cache["flash_key_starts"] = key_starts
        longest_query = max(meta.query_lens_list)
        return varlen_attn(
            query,
            kv_cache[0],
            kv_cache[1],
            meta.query_start_loc,
            key_starts,
            longest_query,
            self.max_positions,
            scale=scale,
            window_size=(-1, 0) if window is None else (window - 1, 0),
            enable_gqa=True,
            seqused_k=meta.seq_lens,
            block_table=meta.block_tables,
        )
