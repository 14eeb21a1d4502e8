"""What ``torch.nn.attention.varlen.varlen_attn`` computes over a paged cache, written out
densely: the stand-in for torch's FlashAttention-2 in CPU tests (FA2 has no CPU build)."""

from __future__ import annotations

import torch


def dense_varlen(query, key, value, cu_q, cu_k, max_q, max_k, **kw) -> torch.Tensor:
    """Per sequence ``b``: its queries (rows ``cu_q[b]:cu_q[b+1]``) over its first
    ``seqused_k[b]`` keys, read through row ``b`` of ``block_table`` from the pages ``key`` /
    ``value`` [pages, page_size, kv_heads, head_dim], causal from the bottom right, grouped
    heads. Asserts the argument kinds FlashAttention-2 requires (int32 offsets and tables
    with a contiguous last dimension, pages of a multiple of 256, causal, GQA on)."""
    assert kw["window_size"] == (-1, 0) and kw["enable_gqa"]
    lengths, table = kw["seqused_k"], kw["block_table"]
    for tensor in (cu_q, cu_k, lengths, table):
        assert tensor.dtype == torch.int32 and tensor.stride(-1) == 1
    assert key.shape[1] % 256 == 0 and key.stride(-1) == 1 and max_k >= int(lengths.max())
    assert cu_k[1:].tolist() == lengths.cumsum(0).tolist()
    group = query.shape[1] // key.shape[2]
    out = torch.empty_like(query)
    for b in range(len(lengths)):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        count, queries = int(lengths[b]), rows.stop - rows.start
        assert queries <= max_q
        pages = table[b, : -(-count // key.shape[1])].long()
        keys = key[pages].flatten(0, 1)[:count].repeat_interleave(group, 1)
        values = value[pages].flatten(0, 1)[:count].repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", query[rows].float(), keys.float()) * kw["scale"]
        first = count - queries  # bottom-right causal: query i sees keys up to first + i
        visible = torch.arange(count)[None, :] <= first + torch.arange(queries)[:, None]
        weights = scores.masked_fill(~visible, float("-inf")).softmax(-1)
        out[rows] = torch.einsum("hqk,khd->qhd", weights, values.float()).to(out.dtype)
    return out
