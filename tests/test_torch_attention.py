"""The CPU attention path against a naive dense reference, on a mixed batch."""

from __future__ import annotations

import pytest
import torch

from octavo.attention import kv_quant, torch_ops
from octavo.attention.backend import TorchAttention
from octavo.attention.kv_quant import KVScales
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


def mixed_batch(cache_dtype: torch.dtype, scales: KVScales):
    """A fresh prefill, a prefill over a cached prefix and two decodes; the cached tokens
    stored through ``store_kv``. Returns the output and each sequence's dense reference
    (full-precision keys/values)."""
    torch.manual_seed(0)
    # (already cached tokens, new tokens): fresh prefill, prefill over a prefix, two decodes
    layout = [(0, 7), (5, 6), (9, 1), (17, 1)]
    cache = torch.zeros(2, 32, BLOCK, KV_HEADS, DIM, dtype=cache_dtype)
    free_blocks = iter(torch.randperm(31).add(1).tolist())
    tables, contexts, slots = [], [], []
    for cached, new in layout:
        total = cached + new
        table = [next(free_blocks) for _ in range(-(-total // BLOCK))]
        k, v = torch.randn(total, KV_HEADS, DIM), torch.randn(total, KV_HEADS, DIM)
        positions = torch.arange(total)
        flat_slots = torch.tensor(table)[positions // BLOCK] * BLOCK + positions % BLOCK
        torch_ops.store_kv(k[:cached], v[:cached], cache, flat_slots[:cached], True, scales)
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
    out = TorchAttention().forward(query, key, value, cache, meta, DIM**-0.5, scales)
    expected = []
    for index, ((k, v), (_, new)) in enumerate(zip(contexts, layout, strict=True)):
        q = query[starts[index] : starts[index] + new]
        expected.append((out[starts[index] : starts[index] + new], k, v, q))
    return expected


def test_mixed_batch_matches_dense_reference():
    for got, k, v, q in mixed_batch(torch.float32, KVScales()):
        torch.testing.assert_close(got, naive_attention(q, k, v, DIM**-0.5))


# An fp8 value is off by at most half a step: 1/16 of itself (E4M3's 3 mantissa bits) or
# 1/8 (E5M2), so attention's output is off by about that share of the largest value it
# averages (exactly that for a query that sees one key), plus the keys' share.
FP8_RELATIVE_BOUND = {torch.float8_e4m3fn: 1 / 16, torch.float8_e5m2: 1 / 8}


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("scales", [KVScales(), KVScales(0.05, 0.02)])
def test_fp8_mixed_batch_is_the_reference_over_the_stored_values(fp8, scales):
    """Exactly (fp32 tolerance) the dense attention over what the cache holds, and within
    FP8_BOUND of the full-precision attention."""
    for got, k, v, q in mixed_batch(fp8, scales):
        stored_k = kv_quant.dequantize(kv_quant.quantize(k, scales.k, fp8), scales.k, k.dtype)
        stored_v = kv_quant.dequantize(kv_quant.quantize(v, scales.v, fp8), scales.v, v.dtype)
        torch.testing.assert_close(got, naive_attention(q, stored_k, stored_v, DIM**-0.5))
        full = naive_attention(q, k, v, DIM**-0.5)
        error = (got - full).abs().max() / v.abs().max()
        assert error <= FP8_RELATIVE_BOUND[fp8]


def test_fp8_prefill_reads_what_a_cached_prefix_would():
    """A fresh prefill attends over its keys as stored, so a prompt's output is the same
    whether its prefix came from the prefix cache or not."""
    fp8, scales = torch.float8_e4m3fn, KVScales(0.5, 0.25)
    q, k, v = (
        torch.randn(9, HEADS, DIM),
        torch.randn(9, KV_HEADS, DIM),
        torch.randn(9, KV_HEADS, DIM),
    )
    fresh = torch_ops.causal_attention(
        q, kv_quant.stored(k, scales.k, fp8), kv_quant.stored(v, scales.v, fp8), 0.25, scales
    )
    cache = torch.zeros(2, 4, BLOCK, KV_HEADS, DIM, dtype=fp8)
    torch_ops.store_kv(k, v, cache, torch.arange(4, 13), True, scales)
    cached = torch_ops.prefill_attention(q, cache, torch.tensor([1, 2, 3]), 9, 0.25, scales)
    torch.testing.assert_close(fresh, cached)


def test_fp8_quantize_saturates_and_rounds_to_nearest_even():
    fp8 = torch.float8_e4m3fn
    x = torch.tensor([1e6, -1e6, 448.0, 1.0625, 1.1875, 2**-9 * 1.5, float("inf")])
    stored = kv_quant.quantize(x, 1.0, fp8).float()
    assert stored.tolist() == [448.0, -448.0, 448.0, 1.0, 1.25, 2**-8, 448.0]
    assert kv_quant.quantize(torch.tensor([900.0]), 2.0, fp8).float().item() == 448.0
    assert kv_quant.kv_cache_dtype("fp8", torch.bfloat16) is fp8
    assert kv_quant.kv_cache_dtype("fp8_e5m2", torch.bfloat16) is torch.float8_e5m2
    assert kv_quant.kv_cache_dtype("auto", torch.bfloat16) is torch.bfloat16
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        kv_quant.kv_cache_dtype("int8", torch.bfloat16)
    with pytest.raises(ValueError, match="k_scale"):
        KVScales(0.0, 1.0)
