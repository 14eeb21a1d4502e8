"""Triton attention with per-layer options (sliding window, soft-cap, sinks) against a
naive dense reference: an explicit softmax over every key of the context.

Without a GPU the kernels run under ``TRITON_INTERPRET=1`` on CPU tensors (small shapes:
the interpreter is slow); with one, they run compiled, and a last test compares the
Triton backend with the torch backend on the GPU.
"""

from __future__ import annotations

import os
import sys

import torch

if not torch.cuda.is_available():  # must be set before triton is first imported
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("triton was imported before this module: run with TRITON_INTERPRET=1")
    os.environ["TRITON_INTERPRET"] = "1"

import pytest

from octavo.attention import triton_decode, triton_kernels
from octavo.attention.kv_quant import UNIT_SCALES, KVScales
from octavo.attention.metadata import AttentionMetadata
from octavo.attention.options import FULL_ATTENTION, AttentionOptions
from octavo.attention.triton_backend import TritonAttention

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, NUM_BLOCKS = 4, 2, 16, 8, 16
TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 3e-2}
NO_GPU = "needs a CUDA GPU (none here: the kernels are checked under TRITON_INTERPRET)"
SINKS = torch.tensor([0.5, -1.0, 2.0, 0.0])  # one per query head; 2.0 takes most of a row
FP8_SCALES = KVScales(0.37, 2.5)

# Windows of 1 (only itself), 6 (crosses block edges, block_size 8), 17 (crosses the
# prefill kernel's 16-token KV tiles and block edges) and 99 (larger than every context).
# The interpreter is slow: each kernel gets the cases that exercise its own code paths.
OPTIONS = {
    "window1": AttentionOptions(sliding_window=1),
    "window6": AttentionOptions(sliding_window=6),
    "window17": AttentionOptions(sliding_window=17),
    "window99": AttentionOptions(sliding_window=99),
    "softcap": AttentionOptions(soft_cap=2.0),
    "sinks": AttentionOptions(sinks=SINKS),
    "all": AttentionOptions(sliding_window=6, soft_cap=2.0, sinks=SINKS),
}
DECODE_CASES = ["window6", "window99", "softcap", "sinks", "all"]
PREFILL_CASES = ["window1", "window17", "window99", "softcap", "sinks", "all"]


def seeded(*shape: int, seed: int, spread: float = 1.0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * spread


def on_device(options: AttentionOptions) -> AttentionOptions:
    if options.sinks is None:
        return options
    return AttentionOptions(options.sliding_window, options.soft_cap, options.sinks.to(DEVICE))


def block_tables(seq_lens: list[int], seed: int = 0) -> torch.Tensor:
    """Shuffled block ids (0 is the null block) for each sequence, rows padded with 0."""
    ids = torch.randperm(NUM_BLOCKS - 1, generator=torch.Generator().manual_seed(seed)) + 1
    needed = [-(-n // BLOCK_SIZE) for n in seq_lens]
    table = torch.zeros(len(seq_lens), max(needed) + 1, dtype=torch.int32)
    used = 0
    for row, count in enumerate(needed):
        table[row, :count] = ids[used : used + count]
        used += count
    return table


def random_cache(dtype: torch.dtype) -> torch.Tensor:
    shape = (2, NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    return seeded(*shape, seed=11, spread=2.0).to(dtype)


def context(cache: torch.Tensor, table_row: torch.Tensor, length: int, scales: KVScales):
    """Keys and values ``[length, kv_heads, head_dim]`` of one sequence, in fp32, scaled."""
    positions = torch.arange(length)
    blocks = table_row.cpu().long()[positions // BLOCK_SIZE]
    keys = cache[0].cpu()[blocks, positions % BLOCK_SIZE].float() * scales.k
    values = cache[1].cpu()[blocks, positions % BLOCK_SIZE].float() * scales.v
    return keys, values


def reference(query, keys, values, first_pos: int, scale: float, options) -> torch.Tensor:
    """Dense attention of queries at positions ``first_pos, first_pos + 1, ...`` over keys
    ``0 .. len - 1``: scaled scores, soft-cap, causal/window mask, explicit softmax with the
    sink as one more logit per head."""
    group = NUM_HEADS // NUM_KV_HEADS
    k, v = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", query.cpu().float(), k) * scale
    if options.soft_cap is not None:
        scores = options.soft_cap * torch.tanh(scores / options.soft_cap)
    query_pos = torch.arange(first_pos, first_pos + query.shape[0])[:, None]
    key_pos = torch.arange(keys.shape[0])[None, :]
    visible = key_pos <= query_pos
    if options.sliding_window is not None:
        visible &= key_pos > query_pos - options.sliding_window
    scores = scores.masked_fill(~visible, float("-inf"))
    if options.sinks is not None:
        sink = options.sinks.cpu().float()[:, None, None].expand(-1, query.shape[0], 1)
        scores = torch.cat([scores, sink], dim=-1)
    weights = torch.exp(scores - scores.amax(-1, keepdim=True))
    probs = (weights / weights.sum(-1, keepdim=True))[..., : keys.shape[0]]
    return torch.einsum("hqk,khd->qhd", probs, v)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(actual.cpu().float(), expected, atol=tol, rtol=tol)


def check_decode(options, dtype=torch.float32, cache_dtype=None, scales=UNIT_SCALES) -> None:
    """Three sequences, partial last blocks (block_size 8), GQA 4:2."""
    seq_lens = [3, 9, 21]
    cache, tables = random_cache(cache_dtype or dtype), block_tables(seq_lens)
    query = seeded(len(seq_lens), NUM_HEADS, HEAD_DIM, seed=3, spread=2.0).to(dtype)
    out = triton_decode.paged_decode_attention(
        query.to(DEVICE),
        cache.to(DEVICE),
        tables.to(DEVICE),
        torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        max(seq_lens),
        HEAD_DIM**-0.5,
        scales=scales,
        options=on_device(options),
    )
    for i, seq_len in enumerate(seq_lens):
        keys, values = context(cache, tables[i], seq_len, scales)
        expected = reference(query[i : i + 1], keys, values, seq_len - 1, HEAD_DIM**-0.5, options)
        assert_close(out[i : i + 1], expected, dtype)


def check_prefill(options, dtype=torch.float32, cache_dtype=None, scales=UNIT_SCALES) -> None:
    """Two chunks: a fresh prompt, and 19 queries over a cached prefix of 11 (two 16-token
    KV tiles, a partial query tile, a partial last block)."""
    seq_lens, query_lens = [9, 30], [9, 19]
    cache, tables = random_cache(cache_dtype or dtype), block_tables(seq_lens)
    starts = [0, 9, 28]
    query = seeded(starts[-1], NUM_HEADS, HEAD_DIM, seed=4, spread=2.0).to(dtype)
    out = triton_kernels.prefill_attention(
        query.to(DEVICE),
        cache.to(DEVICE),
        tables.to(DEVICE),
        torch.tensor(starts, dtype=torch.int32, device=DEVICE),
        torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        max(query_lens),
        HEAD_DIM**-0.5,
        scales=scales,
        options=on_device(options),
    )
    for i, (seq_len, q_len) in enumerate(zip(seq_lens, query_lens, strict=True)):
        keys, values = context(cache, tables[i], seq_len, scales)
        chunk = query[starts[i] : starts[i + 1]]
        expected = reference(chunk, keys, values, seq_len - q_len, HEAD_DIM**-0.5, options)
        assert_close(out[starts[i] : starts[i + 1]], expected, dtype)


@pytest.mark.parametrize("name", DECODE_CASES)
def test_decode_options_match_dense_reference(name: str) -> None:
    check_decode(OPTIONS[name])


@pytest.mark.parametrize("name", PREFILL_CASES)
def test_prefill_options_match_dense_reference(name: str) -> None:
    check_prefill(OPTIONS[name])


def test_half_prefill_with_all_options() -> None:
    """fp16 operands in the prefill kernel's dots (decode computes in fp32 either way)."""
    check_prefill(OPTIONS["all"], torch.float16)


def test_fp8_cache_scales_with_all_options() -> None:
    """The cache's k/v scales fold in before the soft-cap (it caps the real scores)."""
    check_decode(OPTIONS["all"], cache_dtype=torch.float8_e4m3fn, scales=FP8_SCALES)
    check_prefill(OPTIONS["all"], cache_dtype=torch.float8_e5m2, scales=FP8_SCALES)


def test_reference_options_change_the_answer() -> None:
    """Each option moves the dense reference well past the tolerance at these shapes, so
    the comparisons above would catch a kernel that ignored it."""
    cache, tables = random_cache(torch.float32), block_tables([21])
    keys, values = context(cache, tables[0], 21, UNIT_SCALES)
    query = seeded(5, NUM_HEADS, HEAD_DIM, seed=4, spread=2.0)
    plain = reference(query, keys, values, 16, HEAD_DIM**-0.5, FULL_ATTENTION)
    for name in ("window6", "window17", "softcap", "sinks"):
        moved = reference(query, keys, values, 16, HEAD_DIM**-0.5, OPTIONS[name])
        assert (moved - plain).abs().max() > 0.05, name


def test_blocks_before_the_window_are_never_read() -> None:
    """Blocks wholly before every query's window may be freed: their table entries point at
    a block of NaNs here, and neither kernel's output changes."""
    seq_lens, window = [30], 6
    cache, tables = random_cache(torch.float32), block_tables(seq_lens)
    cache[:, 0] = float("nan")  # the null block
    stale = tables.clone()
    stale[0, : (30 - 5 - window + 1) // BLOCK_SIZE] = 0  # earliest query: position 25
    query = seeded(5, NUM_HEADS, HEAD_DIM, seed=4)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    options = AttentionOptions(sliding_window=window)
    args = (cache.to(DEVICE), stale.to(DEVICE))
    starts = torch.tensor([0, 5], dtype=torch.int32, device=DEVICE)
    prefill = triton_kernels.prefill_attention(
        query.to(DEVICE), *args, starts, lens, 5, HEAD_DIM**-0.5, options=options
    )
    decode = triton_decode.paged_decode_attention(
        query[-1:].to(DEVICE), *args, lens, 30, HEAD_DIM**-0.5, options=options
    )
    keys, values = context(cache, tables[0], 30, UNIT_SCALES)
    expected = reference(query, keys, values, 25, HEAD_DIM**-0.5, options)
    assert_close(prefill, expected, torch.float32)
    assert_close(decode, prefill[-1:].cpu(), torch.float32)


@pytest.mark.parametrize(
    "options",
    [
        AttentionOptions(sliding_window=0),
        AttentionOptions(soft_cap=0.0),
        AttentionOptions(sinks=torch.zeros(NUM_KV_HEADS)),
    ],
)
def test_invalid_options_are_refused(options: AttentionOptions) -> None:
    cache = random_cache(torch.float32).to(DEVICE)
    query = torch.zeros(1, NUM_HEADS, HEAD_DIM, device=DEVICE)
    lens = torch.tensor([3], dtype=torch.int32, device=DEVICE)
    tables = block_tables([3]).to(DEVICE)
    with pytest.raises(ValueError, match=r"sliding_window|soft_cap|sinks"):
        triton_decode.paged_decode_attention(query, cache, tables, lens, 3, 1.0, options=options)


Step = tuple[tuple[torch.Tensor, ...], torch.Tensor, AttentionMetadata]


def mixed_step(dtype: torch.dtype) -> Step:
    """A fresh prefill, a prefill over a cached prefix, then three decodes: the step's
    ``(query, key, value)``, a cache holding every earlier token, and the metadata."""
    seq_lens, query_lens = [9, 22, 5, 14, 19], [9, 6, 1, 1, 1]
    tables = block_tables(seq_lens, seed=1)
    slots, starts = [], [0]
    for row, (seq_len, q_len) in enumerate(zip(seq_lens, query_lens, strict=True)):
        for pos in range(seq_len - q_len, seq_len):
            slots.append(int(tables[row, pos // BLOCK_SIZE]) * BLOCK_SIZE + pos % BLOCK_SIZE)
        starts.append(starts[-1] + q_len)
    qkv = (
        seeded(starts[-1], heads, HEAD_DIM, seed=seed, spread=2.0).to(DEVICE, dtype)
        for seed, heads in ((5, NUM_HEADS), (6, NUM_KV_HEADS), (7, NUM_KV_HEADS))
    )
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, device=DEVICE),
        block_tables=tables.to(DEVICE),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=DEVICE),
        num_prefills=2,
        num_prefill_tokens=starts[2],
        query_lens_list=query_lens,
        query_start_loc_list=starts,
        seq_lens_list=seq_lens,
        max_seq_len=max(seq_lens),
    )
    return tuple(qkv), random_cache(dtype).to(DEVICE), meta


def test_backend_forward_mixed_step_with_options() -> None:
    """``TritonAttention.forward(..., options=)``: both launches get the options."""
    (query, key, value), cache, meta = mixed_step(torch.float32)
    options = on_device(OPTIONS["all"])
    out = TritonAttention().forward(query, key, value, cache, meta, HEAD_DIM**-0.5, options=options)
    for i, seq_len in enumerate(meta.seq_lens_list):
        start, q_len = meta.query_start_loc_list[i], meta.query_lens_list[i]
        keys, values = context(cache, meta.block_tables[i], seq_len, UNIT_SCALES)
        chunk = query[start : start + q_len]
        expected = reference(chunk, keys, values, seq_len - q_len, HEAD_DIM**-0.5, options)
        assert_close(out[start : start + q_len], expected, torch.float32)


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
@pytest.mark.parametrize("cache_dtype", [None, torch.float8_e4m3fn])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("name", ["window6", "softcap", "sinks", "all"])
def test_cuda_kernels_match_torch_backend(name: str, dtype, cache_dtype) -> None:
    """The compiled kernels against the torch backend with the same options on the GPU."""
    from octavo.attention.backend import TorchAttention

    (query, key, value), cache, meta = mixed_step(dtype)
    cache = cache.float().to(cache_dtype or dtype)
    scales = FP8_SCALES if cache_dtype else UNIT_SCALES
    options, ref_cache = on_device(OPTIONS[name]), cache.clone()
    args = (meta, HEAD_DIM**-0.5, scales)
    expected = TorchAttention().forward(query, key, value, ref_cache, *args, options=options)
    out = TritonAttention().forward(query, key, value, cache, *args, options=options)
    assert torch.equal(cache.view(torch.uint8), ref_cache.view(torch.uint8))
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.float(), expected.float(), atol=tol, rtol=tol)
