"""Paged attention in plain torch: the CPU serving path and the reference for the kernels.

The KV cache of one layer is one tensor ``[2, num_blocks, block_size, num_kv_heads,
head_dim]`` (index 0 keys, 1 values). Sequences find their tokens through a block table.
An fp8 cache (``kv_quant``) stores ``key / k_scale``; attention multiplies the softmax scale
by ``k_scale`` and the output by ``v_scale`` instead of rescaling every stored value.

Every attention function takes the layer's ``AttentionOptions``. Plain layers and
window-only layers go through ``scaled_dot_product_attention`` (a window is a boolean
mask, and so is a chunk of chunked local attention); soft-capping and sinks, which SDPA
lacks, take an explicit fp32 softmax.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from octavo.attention.kv_quant import UNIT_SCALES, KVScales, is_fp8, quantize
from octavo.attention.options import FULL_ATTENTION, AttentionOptions

EXPLICIT_QUERY_ROWS = 256  # query rows per explicit-softmax call: bounds the score matrix


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


def needs_explicit_softmax(options: AttentionOptions) -> bool:
    """Soft-capping and sinks change the softmax itself: SDPA cannot do them."""
    return options.soft_cap is not None or options.sinks is not None


def visible_keys(
    query_pos: torch.Tensor,
    key_pos: torch.Tensor,
    window: int | None,
    spans: Sequence[tuple[int, int]] = (),
    chunk: int | None = None,
    both_ways: bool = False,
) -> torch.Tensor:
    """``[Q, K]`` bool: key ``j`` is visible to query ``i`` iff ``i - window < j <= i``.

    ``spans``: position ranges ``[first, end)`` whose queries also see the range's later
    keys (Gemma 3's images); the window still applies (transformers' AND(window, OR(causal,
    block))). ``chunk``: also ``j >= floor(i / chunk) * chunk`` (chunked local attention).
    ``both_ways``: the window bounds later keys too, ``j < i + window``."""
    visible = key_pos[None, :] <= query_pos[:, None]
    for first, end in spans:
        in_query = (query_pos >= first) & (query_pos < end)
        in_key = (key_pos >= first) & (key_pos < end)
        visible |= in_query[:, None] & in_key[None, :]
    if window is not None:
        visible &= key_pos[None, :] > query_pos[:, None] - window
        if both_ways:
            visible &= key_pos[None, :] < query_pos[:, None] + window
    if chunk is not None:
        visible &= key_pos[None, :] >= (query_pos[:, None] // chunk) * chunk
    return visible


def _masked_scores(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return scores
    if mask.dtype == torch.bool:
        return scores.masked_fill(~mask, float("-inf"))
    return scores + mask.float()


def _explicit_rows(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    scale: float,
    scales: KVScales,
    options: AttentionOptions,
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """One slice of query rows of ``explicit_attention`` (same arguments)."""
    batch, heads, rows, dim = query.shape
    kv_heads, num_keys = keys.shape[1], keys.shape[2]
    group = heads // kv_heads
    grouped = query.float().reshape(batch, kv_heads, group * rows, dim)
    scores = grouped @ keys.float().transpose(-1, -2) * (scale * scales.k)
    scores = scores.view(batch, heads, rows, num_keys)
    if options.soft_cap is not None:
        scores = torch.tanh(scores / options.soft_cap) * options.soft_cap
    scores = _masked_scores(scores, mask)
    if options.sinks is not None:
        sinks = options.sinks.float().to(scores.device).view(1, heads, 1, 1)
        scores = torch.cat([scores, sinks.expand(batch, heads, rows, 1)], dim=-1)
    probs = torch.softmax(scores, dim=-1)[..., :num_keys]
    out = probs.reshape(batch, kv_heads, group * rows, num_keys) @ values.float()
    out = out.view(batch, heads, rows, dim)
    return (out if scales.v == 1.0 else out * scales.v).to(query.dtype)


def explicit_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    scale: float,
    scales: KVScales,
    options: AttentionOptions,
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """Softmax attention written out in fp32, with soft-capping and sinks.

    ``query [B, heads, Q, D]``; ``keys``/``values`` ``[B, kv_heads, K, D]`` as stored (GQA:
    query head ``h`` reads KV head ``h // (heads / kv_heads)``); ``mask`` broadcastable to
    ``[B, heads, Q, K]``, boolean (True = visible) or additive. Query rows go in slices.
    """
    rows = query.shape[2]
    if rows <= EXPLICIT_QUERY_ROWS:
        return _explicit_rows(query, keys, values, scale, scales, options, mask)
    outputs = []
    for first in range(0, rows, EXPLICIT_QUERY_ROWS):
        part = slice(first, first + EXPLICIT_QUERY_ROWS)
        part_mask = mask if mask is None or mask.shape[-2] == 1 else mask[..., part, :]
        outputs.append(
            _explicit_rows(query[:, :, part], keys, values, scale, scales, options, part_mask)
        )
    return torch.cat(outputs, dim=2)


def _attend_visible(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    scale: float,
    scales: KVScales,
    options: AttentionOptions,
    visible: torch.Tensor,
) -> torch.Tensor:
    """``query [B, heads, Q, D]`` over ``keys [B, kv_heads, K, D]`` where ``visible``."""
    if needs_explicit_softmax(options):
        return explicit_attention(query, keys, values, scale, scales, options, visible)
    return _attend(query, keys, values, scale, scales, attn_mask=visible, enable_gqa=True)


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
    options: AttentionOptions = FULL_ATTENTION,
) -> torch.Tensor:
    """One new token per sequence: ``query [B, heads, head_dim]`` → ``[B, heads, head_dim]``."""
    keys, values = gather_kv(kv_cache, block_tables, max_seq_len)
    positions = torch.arange(max_seq_len, device=query.device)
    last = seq_lens[:, None].to(positions.dtype) - 1
    mask = visible_keys(last.view(-1), positions, options.sliding_window, (), options.chunk_size)
    mask = mask.view(-1, 1, 1, max_seq_len)
    out = _attend_visible(query.unsqueeze(2), keys, values, scale, scales, options, mask)
    return out.squeeze(2)


def causal_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scale: float,
    scales: KVScales = UNIT_SCALES,
    options: AttentionOptions = FULL_ATTENTION,
    spans: Sequence[tuple[int, int]] = (),
) -> torch.Tensor:
    """Causal attention of a prompt chunk with no cached prefix (``[Q, heads, dim]``);
    ``key``/``value`` as the cache stores them (``kv_quant.stored``). ``spans``: position
    ranges attended both ways (``visible_keys``)."""
    q, k, v = (x.transpose(0, 1)[None] for x in (query, key, value))
    if options.is_plain and not spans:
        out = _attend(q, k, v, scale, scales, is_causal=True, enable_gqa=True)
    else:
        positions = torch.arange(query.shape[0], device=query.device)
        visible = visible_keys(
            positions,
            positions,
            options.sliding_window,
            spans,
            options.chunk_size,
            options.window_both_ways,
        )
        out = _attend_visible(q, k, v, scale, scales, options, visible)
    return out[0].transpose(0, 1)


def prefill_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_len: int,
    scale: float,
    scales: KVScales = UNIT_SCALES,
    options: AttentionOptions = FULL_ATTENTION,
    spans: Sequence[tuple[int, int]] = (),
) -> torch.Tensor:
    """Causal attention of one prefill chunk over its cached prefix and itself.

    ``query [Q, heads, head_dim]`` holds the last ``Q`` tokens of a context of ``seq_len``
    tokens whose keys/values are already in the cache. A window (or an attention chunk)
    reads only the keys some query of the chunk can see. ``spans``: position ranges
    attended both ways.
    """
    num_queries = query.shape[0]
    keys, values = gather_kv(kv_cache, block_table[None], seq_len)
    q = query.transpose(0, 1)[None]
    if options.is_plain and num_queries == seq_len and not spans:
        out = _attend(q, keys, values, scale, scales, is_causal=True, enable_gqa=True)
        return out[0].transpose(0, 1)
    first_key = 0
    if options.sliding_window is not None:
        first_key = max(0, seq_len - num_queries - options.sliding_window + 1)
    if options.chunk_size is not None:
        first_key = max(
            first_key, (seq_len - num_queries) // options.chunk_size * options.chunk_size
        )
    keys, values = keys[:, :, first_key:], values[:, :, first_key:]
    query_pos = torch.arange(seq_len - num_queries, seq_len, device=query.device)
    key_pos = torch.arange(first_key, seq_len, device=query.device)
    visible = visible_keys(
        query_pos,
        key_pos,
        options.sliding_window,
        spans,
        options.chunk_size,
        options.window_both_ways,
    )
    out = _attend_visible(q, keys, values, scale, scales, options, visible)
    return out[0].transpose(0, 1)


def decode_gather_plan(
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    dtype: torch.dtype,
    window: int | None = None,
    chunk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cache slots of every visible context position of each decoding sequence.

    Without a window that is the whole context; with one, the last ``window`` positions;
    with an attention chunk, the positions of the last token's chunk.
    Returns ``slots [B * L]`` (padding points at slot 0 of the null block) and an additive
    mask ``[B, 1, 1, L]`` that hides the padding. Every layer with this window reuses both.
    """
    lens = seq_lens.long()
    width, starts = _visible_span(lens, int(seq_lens.max()), window, chunk)
    positions = starts[:, None] + torch.arange(width, device=block_tables.device)[None, :]
    valid = positions < lens[:, None]
    positions = torch.where(valid, positions, 0)
    blocks = block_tables.long().gather(1, positions // block_size)
    slots = torch.where(valid, blocks * block_size + positions % block_size, 0).reshape(-1)
    mask = torch.zeros(valid.shape, dtype=dtype, device=valid.device)
    mask = mask.masked_fill(~valid, float("-inf"))[:, None, None, :]
    return slots, mask


def _visible_span(
    lens: torch.Tensor, max_len: int, window: int | None, chunk: int | None
) -> tuple[int, torch.Tensor]:
    """The gathered width and each decoding sequence's first visible position."""
    width, starts = max_len, torch.zeros_like(lens)
    if window is not None:
        width, starts = min(width, window), (lens - window).clamp(min=0)
    if chunk is not None:
        width, starts = min(width, chunk), torch.maximum(starts, (lens - 1) // chunk * chunk)
    return width, starts


def grouped_decode_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    slots: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    scales: KVScales = UNIT_SCALES,
    options: AttentionOptions = FULL_ATTENTION,
) -> torch.Tensor:
    """Decode attention with each KV head's query heads as rows of one small attention call.

    ``query [B, heads, head_dim]``; the ``heads / kv_heads`` query heads that share a KV
    head become that head's query rows, so no key/value is repeated for GQA. ``slots`` and
    ``mask`` come from ``decode_gather_plan`` (with the layer's window).
    """
    batch, num_heads, head_dim = query.shape
    num_kv_heads = kv_cache.shape[3]
    flat = kv_cache.view(2, -1, num_kv_heads, head_dim)
    keys = flat[0].index_select(0, slots).view(batch, -1, num_kv_heads, head_dim)
    values = flat[1].index_select(0, slots).view(batch, -1, num_kv_heads, head_dim)
    keys, values = keys.transpose(1, 2), values.transpose(1, 2)
    if needs_explicit_softmax(options):
        out = explicit_attention(query[:, :, None], keys, values, scale, scales, options, mask)
        return out.view(batch, num_heads, head_dim)
    grouped = query.reshape(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)
    out = _attend(grouped, keys, values, scale, scales, attn_mask=mask.to(query.dtype))
    return out.reshape(batch, num_heads, head_dim)
