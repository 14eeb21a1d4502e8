"""What torch's FlashAttention-2 computes, written out densely: the stand-in for it in CPU
tests (FA2 has no CPU build). ``dense_varlen`` is ``torch.nn.attention.varlen.varlen_attn``
over a paged cache (torch 2.13); ``dense_flash_forward`` is
``torch.ops.aten._flash_attention_forward`` over contiguous keys with ``seqused_k``."""

from __future__ import annotations

import torch


def dense_varlen(query, key, value, cu_q, cu_k, max_q, max_k, **kw) -> torch.Tensor:
    """Per sequence ``b``: its queries (rows ``cu_q[b]:cu_q[b+1]``) over its first
    ``seqused_k[b]`` keys, read through row ``b`` of ``block_table`` from the pages ``key`` /
    ``value`` [pages, page_size, kv_heads, head_dim], causal from the bottom right (with
    ``window_size=(left, 0)``, over the ``left`` keys before each query and itself), grouped
    heads. Asserts the argument kinds FlashAttention-2 requires (int32 offsets and tables
    with a contiguous last dimension, pages of a multiple of 256, causal, GQA on)."""
    left, right = kw["window_size"]
    assert right == 0 and (left == -1 or left >= 0) and kw["enable_gqa"]
    lengths, table = kw["seqused_k"], kw["block_table"]
    assert table.dtype == torch.int32 and table.stride(-1) == 1
    assert key.shape[1] % 256 == 0 and key.stride(-1) == 1
    out = torch.empty_like(query)
    for b, rows, count in _sequences(cu_q, cu_k, lengths, max_q, max_k):
        pages = table[b, : -(-count // key.shape[1])].long()
        keys, values = (part[pages].flatten(0, 1)[:count] for part in (key, value))
        out[rows] = _attend(query[rows], keys, values, kw["scale"], left)
    return out


def dense_flash_forward(query, key, value, cu_q, cu_k, max_q, max_k, dropout, causal, debug, **kw):
    """Per sequence ``b``: its queries over keys ``cu_k[b] : cu_k[b] + seqused_k[b]`` of the
    contiguous ``key`` / ``value`` [tokens, kv_heads, head_dim], causal from the bottom
    right; the output first of a tuple, as the aten op returns it."""
    assert dropout == 0.0 and causal and not debug and key.stride(-1) == 1
    out = torch.empty_like(query)
    for b, rows, count in _sequences(cu_q, cu_k, kw["seqused_k"], max_q, max_k):
        start = int(cu_k[b])
        keys, values = key[start : start + count], value[start : start + count]
        out[rows] = _attend(query[rows], keys, values, kw["scale"])
    return out, None


def _sequences(cu_q, cu_k, lengths, max_q, max_k):
    """``(b, query rows, key count)`` per sequence, after the int32 checks FA2 makes."""
    for tensor in (cu_q, cu_k, lengths):
        assert tensor.dtype == torch.int32 and tensor.stride(-1) == 1
    assert max_k >= int(lengths.max())
    for b in range(len(lengths)):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        assert rows.stop - rows.start <= max_q
        yield b, rows, int(lengths[b])


def _attend(queries, keys, values, scale: float, left: int = -1) -> torch.Tensor:
    """Causal from the bottom right (query ``i`` of ``Q`` sees keys up to ``count - Q + i``,
    and with ``left >= 0`` none before ``count - Q + i - left``), each query head on its
    group's key head."""
    group = queries.shape[1] // keys.shape[1]
    keys, values = (part.repeat_interleave(group, 1).float() for part in (keys, values))
    scores = torch.einsum("qhd,khd->hqk", queries.float(), keys) * scale
    first = len(keys) - len(queries)
    positions = first + torch.arange(len(queries))[:, None]
    visible = torch.arange(len(keys))[None, :] <= positions
    if left >= 0:
        visible &= torch.arange(len(keys))[None, :] >= positions - left
    weights = scores.masked_fill(~visible, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", weights, values).to(queries.dtype)
