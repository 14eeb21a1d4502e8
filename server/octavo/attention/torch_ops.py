"""Paged attention in plain torch: the CPU serving path and the reference for the kernels.

The KV cache of one layer is one tensor ``[2, num_blocks, block_size, num_kv_heads,
head_dim]`` (index 0 keys, 1 values). Sequences find their tokens through a block table.
An fp8 cache (``kv_quant``) stores ``key / k_scale``; attention multiplies the softmax scale
by ``k_scale`` and the output by ``v_scale`` instead of rescaling every stored value.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from octavo.attention.kv_quant import UNIT_SCALES, KVScales, is_fp8, quantize


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    may_skip: bool = True,
    scales: KVScales = UNIT_SCALES,
) -> None:
    """Write each token's key/value ``[T, kv_heads, head_dim]`` into its cache slot.

    Slots of -1 are skipped; ``may_skip=False`` promises there are none (saves a check).
    An fp8 cache gets ``quantize(key, scales.k)`` (its bytes: torch has no fp8 index_copy).
    """
    num_blocks, block_size = kv_cache.shape[1], kv_cache.shape[2]
    if may_skip:
        valid = slot_mapping >= 0
        if not bool(valid.all()):
            slot_mapping, key, value = slot_mapping[valid], key[valid], value[valid]
    if is_fp8(kv_cache.dtype):
        key = quantize(key, scales.k, kv_cache.dtype).view(torch.uint8)
        value = quantize(value, scales.v, kv_cache.dtype).view(torch.uint8)
        kv_cache = kv_cache.view(torch.uint8)
    flat = kv_cache.view(2, num_blocks * block_size, *kv_cache.shape[3:])
    flat[0].index_copy_(0, slot_mapping, key.to(flat.dtype))
    flat[1].index_copy_(0, slot_mapping, value.to(flat.dtype))


def _attend(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    scale: float,
    scales: KVScales,
    **options,
) -> torch.Tensor:
    """``scaled_dot_product_attention`` over keys/values as stored (any cache dtype), with
    the cache's scales folded in: ``k_scale`` into the softmax scale, ``v_scale`` after."""
    out = F.scaled_dot_product_attention(
        query, keys.to(query.dtype), values.to(query.dtype), scale=scale * scales.k, **options
    )
    return out if scales.v == 1.0 else out * scales.v


def gather_kv(
    kv_cache: torch.Tensor, block_tables: torch.Tensor, context_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of the first ``context_len`` tokens of each sequence in the table.

    Returns two tensors ``[num_seqs, kv_heads, context_len, head_dim]``.
    """
    block_size = kv_cache.shape[2]
    num_blocks_needed = -(-context_len // block_size)
    table = block_tables[:, :num_blocks_needed].long()
    keys = kv_cache[0][table].flatten(1, 2)[:, :context_len]
    values = kv_cache[1][table].flatten(1, 2)[:, :context_len]
    return keys.transpose(1, 2), values.transpose(1, 2)


def paged_decode_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    scale: float,
    scales: KVScales = UNIT_SCALES,
) -> torch.Tensor:
    """One new token per sequence: ``query [B, heads, head_dim]`` → ``[B, heads, head_dim]``."""
    keys, values = gather_kv(kv_cache, block_tables, max_seq_len)
    positions = torch.arange(max_seq_len, device=query.device)
    mask = (positions[None, :] < seq_lens[:, None].to(positions.dtype))[:, None, None, :]
    out = _attend(query.unsqueeze(2), keys, values, scale, scales, attn_mask=mask, enable_gqa=True)
    return out.squeeze(2)


def causal_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scale: float,
    scales: KVScales = UNIT_SCALES,
) -> torch.Tensor:
    """Plain causal attention of a prompt chunk with no cached prefix (``[Q, heads, dim]``);
    ``key``/``value`` as the cache stores them (``kv_quant.stored``)."""
    out = _attend(
        query.transpose(0, 1)[None],
        key.transpose(0, 1)[None],
        value.transpose(0, 1)[None],
        scale,
        scales,
        is_causal=True,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1)


def prefill_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_len: int,
    scale: float,
    scales: KVScales = UNIT_SCALES,
) -> torch.Tensor:
    """Causal attention of one prefill chunk over its cached prefix and itself.

    ``query [Q, heads, head_dim]`` holds the last ``Q`` tokens of a context of ``seq_len``
    tokens whose keys/values are already in the cache.
    """
    num_queries = query.shape[0]
    keys, values = gather_kv(kv_cache, block_table[None], seq_len)
    q = query.transpose(0, 1)[None]
    if num_queries == seq_len:
        out = _attend(q, keys, values, scale, scales, is_causal=True, enable_gqa=True)
    else:
        query_pos = torch.arange(seq_len - num_queries, seq_len, device=query.device)
        key_pos = torch.arange(seq_len, device=query.device)
        mask = key_pos[None, :] <= query_pos[:, None]
        out = _attend(q, keys, values, scale, scales, attn_mask=mask, enable_gqa=True)
    return out[0].transpose(0, 1)


def decode_gather_plan(
    block_tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cache slots of every context position of each decoding sequence, computed once a step.

    Returns ``slots [B * L]`` (padding points at slot 0 of the null block) and an additive
    mask ``[B, 1, 1, L]`` that hides the padding. Every layer reuses both.
    """
    max_len = int(seq_lens.max())
    positions = torch.arange(max_len, device=block_tables.device)
    blocks = block_tables[:, positions // block_size].long()
    slots = blocks * block_size + positions % block_size
    valid = positions[None, :] < seq_lens[:, None]
    slots = torch.where(valid, slots, 0).reshape(-1)
    mask = torch.zeros(valid.shape, dtype=dtype, device=valid.device)
    mask = mask.masked_fill(~valid, float("-inf"))[:, None, None, :]
    return slots, mask


def grouped_decode_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    slots: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    scales: KVScales = UNIT_SCALES,
) -> torch.Tensor:
    """Decode attention with each KV head's query heads as rows of one small attention call.

    ``query [B, heads, head_dim]``; the ``heads / kv_heads`` query heads that share a KV
    head become that head's query rows, so no key/value is repeated for GQA.
    """
    batch, num_heads, head_dim = query.shape
    num_kv_heads = kv_cache.shape[3]
    flat = kv_cache.view(2, -1, num_kv_heads, head_dim)
    keys = flat[0].index_select(0, slots).view(batch, -1, num_kv_heads, head_dim)
    values = flat[1].index_select(0, slots).view(batch, -1, num_kv_heads, head_dim)
    grouped = query.reshape(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)
    out = _attend(
        grouped,
        keys.transpose(1, 2),
        values.transpose(1, 2),
        scale,
        scales,
        attn_mask=mask.to(query.dtype),
    )
    return out.reshape(batch, num_heads, head_dim)
