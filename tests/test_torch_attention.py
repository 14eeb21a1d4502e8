"""The CPU attention path against a naive dense reference, on a mixed batch."""

from __future__ import annotations

import torch

from octavo.attention import torch_ops
from octavo.attention.backend import TorchAttention
from octavo.attention.metadata import AttentionMetadata

HEADS, KV_HEADS, DIM, BLOCK = 6, 2, 16, 4


def naive_attention(q, k, v, scale):
    """Causal attention of the last ``len(q)`` positions over ``k``/``v`` ``[L, kv, d]``."""
    group = HEADS // KV_HEADS
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    offset = k.shape[0] - q.shape[0]
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    allowed = torch.arange(k.shape[0])[None, :] <= torch.arange(q.shape[0])[:, None] + offset
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def test_mixed_batch_matches_dense_reference():
    torch.manual_seed(0)
    # (already cached tokens, new tokens): fresh prefill, prefill over a prefix, two decodes
    layout = [(0, 7), (5, 6), (9, 1), (17, 1)]
    cache = torch.zeros(2, 32, BLOCK, KV_HEADS, DIM)
    free_blocks = iter(torch.randperm(31).add(1).tolist())
    tables, contexts, slots = [], [], []
    for cached, new in layout:
        total = cached + new
        table = [next(free_blocks) for _ in range(-(-total // BLOCK))]
        k, v = torch.randn(total, KV_HEADS, DIM), torch.randn(total, KV_HEADS, DIM)
        positions = torch.arange(total)
        flat_slots = torch.tensor(table)[positions // BLOCK] * BLOCK + positions % BLOCK
        torch_ops.store_kv(k[:cached], v[:cached], cache, flat_slots[:cached])
        tables.append(table)
        contexts.append((k, v))
        slots.append(flat_slots[cached:])
    new_tokens = sum(new for _, new in layout)
    query = torch.randn(new_tokens, HEADS, DIM)
    key = torch.cat([k[c:] for (k, _), (c, _) in zip(contexts, layout, strict=True)])
    value = torch.cat([v[c:] for (_, v), (c, _) in zip(contexts, layout, strict=True)])
    starts = [0, 7, 13, 14, 15]
    width = max(map(len, tables))
    meta = AttentionMetadata(
        slot_mapping=torch.cat(slots),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        seq_lens=torch.tensor([c + n for c, n in layout], dtype=torch.int32),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        num_prefills=2,
        num_prefill_tokens=13,
        query_lens_list=[n for _, n in layout],
        query_start_loc_list=starts[:-1],
        seq_lens_list=[c + n for c, n in layout],
        max_seq_len=18,
    )
    out = TorchAttention().forward(query, key, value, cache, meta, scale=DIM**-0.5)
    for index, ((k, v), (_, new)) in enumerate(zip(contexts, layout, strict=True)):
        q = query[starts[index] : starts[index] + new]
        expected = naive_attention(q, k, v, DIM**-0.5)
        torch.testing.assert_close(out[starts[index] : starts[index] + new], expected)
