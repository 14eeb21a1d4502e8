"""Paged multi-head latent attention (DeepSeek-V2/V3) in plain torch.

One layer's cache is ``[1, num_blocks, block_size, 1, latent_dim]``
(``kv_cache.cache_tensors.KVLayout``): per token the normed compressed latent ``c_kv``
(``kv_lora_rank`` values) followed by the roped shared key ``k_pe``
(``qk_rope_head_dim``): one "head" shared by every query head, instead of keys and
values per KV head. An fp8 cache stores it with a unit scale (``kv_quant``); attention
always reads it back as stored, so a prompt's output does not depend on whether its
prefix came from the cache.

Two forms of the same attention (both exact to transformers' in float32 up to rounding):

* ``expanded_attention`` (prefill): the latents are expanded by ``kv_b_proj`` into per-head
  keys and values, and the chunk attends causally over its cached prefix and itself;
* ``absorbed_decode`` (decode): the query is moved into latent space (``q_nope · W_UK``)
  and attends to the latents themselves as one shared key/value head (MQA); the caller
  maps the latent output back through ``W_UV``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from octavo.attention.kv_quant import is_fp8, quantize, stored
from octavo.attention.torch_ops import visible_keys


def store_latents(latents: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor):
    """Write each token's ``[T, latent_dim]`` entry into its cache slot. A slot of -1 (a
    decode graph's padding row) writes slot 0 of the null block back unchanged: no device
    sync, so the step can be captured as a CUDA graph."""
    flat = kv_cache.view(-1, kv_cache.shape[-1])
    if is_fp8(kv_cache.dtype):
        latents = quantize(latents, 1.0, kv_cache.dtype).view(torch.uint8)
        flat = flat.view(torch.uint8)
    slots = slot_mapping.clamp(min=0)
    kept = flat.index_select(0, slots)
    written = torch.where((slot_mapping >= 0)[:, None], latents.to(flat.dtype), kept)
    flat.index_copy_(0, slots, written)


def decode_plan(
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    width: int,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cache slots of the first ``width`` positions of each decoding sequence and an
    additive mask hiding those at or past its length (``slots [B * width]``, ``mask [B, 1,
    1, width]``): ``torch_ops.decode_gather_plan`` with the width given by the host (the
    step's longest context, or a decode graph's ``max_model_len``), so no device sync."""
    positions = torch.arange(width, device=block_tables.device)[None, :]
    valid = positions < seq_lens.long()[:, None]
    positions = torch.where(valid, positions, 0)
    blocks = block_tables.long().gather(1, positions // block_size)
    slots = torch.where(valid, blocks * block_size + positions % block_size, 0).reshape(-1)
    mask = torch.zeros(valid.shape, dtype=dtype, device=valid.device)
    return slots, mask.masked_fill(~valid, float("-inf"))[:, None, None, :]


def as_stored(latents: torch.Tensor, cache_dtype: torch.dtype) -> torch.Tensor:
    """Fresh entries as the cache holds them (rounded through fp8 for an fp8 cache)."""
    return stored(latents, 1.0, cache_dtype)


def _readable(kv_cache: torch.Tensor) -> torch.Tensor:
    """The cache's single plane ``[blocks, block_size, latent_dim]``, indexable (torch
    cannot gather fp8 on every device: its bytes are gathered instead)."""
    plane = kv_cache[0, :, :, 0]
    return plane.view(torch.uint8) if is_fp8(kv_cache.dtype) else plane


def _as_values(raw: torch.Tensor, kv_cache: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (raw.view(kv_cache.dtype) if is_fp8(kv_cache.dtype) else raw).to(dtype)


def gather_latents(
    kv_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int, dtype: torch.dtype
) -> torch.Tensor:
    """The first ``seq_len`` entries of one sequence, ``[seq_len, latent_dim]`` in ``dtype``."""
    block_size = kv_cache.shape[2]
    blocks = block_table[: -(-seq_len // block_size)].long()
    raw = _readable(kv_cache)[blocks].flatten(0, 1)[:seq_len]
    return _as_values(raw, kv_cache, dtype)


def expanded_attention(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float
) -> torch.Tensor:
    """Causal attention of a chunk's last ``Q`` positions over its ``S``-token context:
    ``query [Q, heads, qk_dim]``, ``keys [S, heads, qk_dim]``, ``values [S, heads, v_dim]``
    → ``[Q, heads, v_dim]``."""
    num_queries, num_keys = query.shape[0], keys.shape[0]
    q, k, v = (x.transpose(0, 1) for x in (query, keys, values))
    if num_queries == num_keys:
        out = F.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=True)
    else:
        key_pos = torch.arange(num_keys, device=query.device)
        visible = visible_keys(key_pos[num_keys - num_queries :], key_pos, None)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scale)
    return out.transpose(0, 1)


def absorbed_decode(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    slots: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    latent_rank: int,
) -> torch.Tensor:
    """One new token per sequence against its cached latents.

    ``query [B, heads, latent_dim]``: each head's ``q_nope · W_UK`` followed by its roped
    ``q_pe``; ``slots``/``mask`` from ``torch_ops.decode_gather_plan``. Every head reads the
    same entries (the key) and their first ``latent_rank`` values (the value): the heads
    are the query rows of one single-head attention. Returns ``[B, heads, latent_rank]``.
    """
    batch, _, latent_dim = query.shape
    raw = _readable(kv_cache).reshape(-1, latent_dim).index_select(0, slots)
    latents = _as_values(raw, kv_cache, query.dtype).view(batch, 1, -1, latent_dim)
    out = F.scaled_dot_product_attention(
        query[:, None],
        latents,
        latents[..., :latent_rank],
        attn_mask=mask.to(query.dtype),
        scale=scale,
    )
    return out[:, 0]
