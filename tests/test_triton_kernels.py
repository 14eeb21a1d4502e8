"""Triton attention kernels against the torch reference path.

Without a GPU the kernels run under ``TRITON_INTERPRET=1`` on CPU tensors; with one, the
same tests run compiled on CUDA tensors, plus a bf16 check.
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

from octavo.attention import torch_ops, triton_decode, triton_kernels
from octavo.attention.backend import TorchAttention
from octavo.attention.kv_quant import KVScales
from octavo.attention.metadata import AttentionMetadata
from octavo.attention.triton_backend import TritonAttention

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
NUM_HEADS, NUM_KV_HEADS = 4, 2
TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 3e-2}
NO_GPU = "needs a CUDA GPU (none on CI: the kernels are checked there under TRITON_INTERPRET)"
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
FP8_SCALES = KVScales(0.37, 2.5)  # not 1: the scales' folding is checked too


def make_cache(
    num_blocks: int, block_size: int, head_dim: int, dtype: torch.dtype, seed: int = 0
) -> torch.Tensor:
    """A cache of random keys/values, so unwritten or misread slots show up as errors."""
    gen = torch.Generator().manual_seed(seed)
    shape = (2, num_blocks, block_size, NUM_KV_HEADS, head_dim)
    return torch.randn(shape, generator=gen).to(DEVICE, dtype)


def make_block_tables(
    seq_lens: list[int], block_size: int, num_blocks: int, seed: int = 0
) -> torch.Tensor:
    """Shuffled, non-contiguous block ids (0 is the null block), rows padded with 0."""
    gen = torch.Generator().manual_seed(seed)
    needed = [-(-n // block_size) for n in seq_lens]
    ids = (torch.randperm(num_blocks - 1, generator=gen) + 1)[: sum(needed)].tolist()
    table = torch.zeros(len(seq_lens), max(needed) + 1, dtype=torch.int32)
    for row, count in enumerate(needed):
        table[row, :count] = torch.tensor(ids[:count], dtype=torch.int32)
        ids = ids[count:]
    return table.to(DEVICE)


def slots_of(table_row: torch.Tensor, positions: range, block_size: int) -> list[int]:
    """Cache slots of the given context positions of one sequence."""
    return [int(table_row[p // block_size]) * block_size + p % block_size for p in positions]


def randn(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Seeded normal tensor on the test device."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE, dtype)


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Compare in fp32 with the tolerance of the tensors' dtype."""
    tol = TOLERANCE[expected.dtype]
    torch.testing.assert_close(actual.float(), expected.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_store_kv_skips_negative_slots(dtype: torch.dtype) -> None:
    cache = make_cache(8, 8, 32, dtype)
    key = randn(5, NUM_KV_HEADS, 32, dtype=dtype, seed=1)
    value = randn(5, NUM_KV_HEADS, 32, dtype=dtype, seed=2)
    slots = torch.tensor([17, -1, 3, 63, 40], device=DEVICE)
    expected = cache.clone()
    torch_ops.store_kv(key, value, expected, slots)
    triton_kernels.store_kv(key, value, cache, slots)
    assert torch.equal(cache, expected)


@pytest.mark.parametrize(
    ("dtype", "block_size", "head_dim"),
    [(torch.float32, 16, 64), (torch.float16, 8, 32), (torch.float32, 8, 24)],
)
def test_paged_decode_matches_torch(dtype: torch.dtype, block_size: int, head_dim: int) -> None:
    seq_lens = [5, 17, 37]
    cache = make_cache(16, block_size, head_dim, dtype)
    tables = make_block_tables(seq_lens, block_size, 16)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    query = randn(3, NUM_HEADS, head_dim, dtype=dtype, seed=3)
    args = (query, cache, tables, lens, max(seq_lens), head_dim**-0.5)
    assert_close(
        triton_decode.paged_decode_attention(*args), torch_ops.paged_decode_attention(*args)
    )


@pytest.mark.parametrize(
    ("dtype", "block_size", "head_dim"),
    [(torch.float32, 16, 32), (torch.float16, 8, 64), (torch.float32, 8, 24)],
)
def test_prefill_chunks_match_torch(dtype: torch.dtype, block_size: int, head_dim: int) -> None:
    seq_lens, query_lens = [17, 37, 5, 20], [17, 12, 5, 1]  # chunks 1 and 3 have a prefix
    cache = make_cache(16, block_size, head_dim, dtype)
    tables = make_block_tables(seq_lens, block_size, 16)
    starts = [0, 17, 29, 34, 35]
    query = randn(starts[-1], NUM_HEADS, head_dim, dtype=dtype, seed=4)
    scale = head_dim**-0.5
    out = triton_kernels.prefill_attention(
        query,
        cache,
        tables,
        torch.tensor(starts, dtype=torch.int32, device=DEVICE),
        torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        max(query_lens),
        scale,
    )
    for i, seq_len in enumerate(seq_lens):
        chunk = query[starts[i] : starts[i + 1]]
        expected = torch_ops.prefill_attention(chunk, cache, tables[i], seq_len, scale)
        assert_close(out[starts[i] : starts[i + 1]], expected)


def test_blocks_of_128_tokens_match_torch() -> None:
    """``--block-size 128`` (vLLM's CPU default): the kernels' key tiles (64) lie within a
    block; contexts and prefill chunks cross block boundaries."""
    head_dim, block_size = 32, 128
    cache = make_cache(8, block_size, head_dim, torch.float32)
    seq_lens, query_lens = [140, 260, 5, 300], [20, 8, 1, 1]  # chunks end past 128 and 256
    tables = make_block_tables(seq_lens, block_size, 8)
    query = randn(sum(query_lens), NUM_HEADS, head_dim, dtype=torch.float32, seed=6)
    scale = head_dim**-0.5
    prefill = triton_kernels.prefill_attention(
        query[:28],
        cache,
        tables[:2],
        torch.tensor([0, 20, 28], dtype=torch.int32, device=DEVICE),
        torch.tensor(seq_lens[:2], dtype=torch.int32, device=DEVICE),
        20,
        scale,
    )
    for row, (start, end) in enumerate([(0, 20), (20, 28)]):
        expected = torch_ops.prefill_attention(
            query[start:end], cache, tables[row], seq_lens[row], scale
        )
        assert_close(prefill[start:end], expected)
    decode_args = (
        query[28:],
        cache,
        tables[2:],
        torch.tensor(seq_lens[2:], dtype=torch.int32, device=DEVICE),
        300,
        scale,
    )
    assert_close(
        triton_decode.paged_decode_attention(*decode_args),
        torch_ops.paged_decode_attention(*decode_args),
    )


def mixed_batch(
    dtype: torch.dtype, block_size: int, head_dim: int, cache_dtype: torch.dtype | None = None
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor, AttentionMetadata]:
    """Two prefill chunks (one fresh, one over a cached prefix) and three decodes.

    Returns ``(query, key, value)``, a cache holding every prefix, and the metadata.
    """
    seq_lens, query_lens = [17, 37, 5, 20, 33], [17, 12, 1, 1, 1]
    cache = make_cache(24, block_size, head_dim, torch.float32).to(cache_dtype or dtype)
    tables = make_block_tables(seq_lens, block_size, 24)
    slots = []
    for row, (seq_len, q_len) in enumerate(zip(seq_lens, query_lens, strict=True)):
        slots += slots_of(tables[row], range(seq_len - q_len, seq_len), block_size)
    starts = [0]
    for q_len in query_lens:
        starts.append(starts[-1] + q_len)
    fused = randn(starts[-1], (NUM_HEADS + 2 * NUM_KV_HEADS) * head_dim, dtype=dtype, seed=5)
    sizes = [NUM_HEADS * head_dim, NUM_KV_HEADS * head_dim, NUM_KV_HEADS * head_dim]
    qkv = [t.view(starts[-1], -1, head_dim) for t in fused.split(sizes, dim=1)]  # strided views
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, device=DEVICE),
        block_tables=tables,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=DEVICE),
        num_prefills=2,
        num_prefill_tokens=starts[2],
        query_lens_list=query_lens,
        query_start_loc_list=starts,
        seq_lens_list=seq_lens,
        max_seq_len=max(seq_lens),
    )
    return tuple(qkv), cache, meta


def check_forward(
    dtype: torch.dtype, block_size: int, head_dim: int, cache_dtype: torch.dtype | None = None
) -> None:
    """TritonAttention.forward equals TorchAttention.forward, output and cache (an fp8
    cache: the same bytes, with scales other than 1)."""
    (query, key, value), cache, meta = mixed_batch(dtype, block_size, head_dim, cache_dtype)
    scales = FP8_SCALES if cache_dtype else KVScales()
    ref_cache = cache.clone()
    scale = head_dim**-0.5
    expected = TorchAttention().forward(query, key, value, ref_cache, meta, scale, scales)
    out = TritonAttention().forward(query, key, value, cache, meta, scale, scales)
    assert out.shape == query.shape and out.dtype == dtype
    assert torch.equal(cache.view(torch.uint8), ref_cache.view(torch.uint8))
    assert_close(out, expected)


@pytest.mark.parametrize(("dtype", "block_size"), [(torch.float32, 16), (torch.float16, 8)])
def test_forward_mixed_batch_matches_torch_backend(dtype: torch.dtype, block_size: int) -> None:
    check_forward(dtype, block_size, 32)


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
def test_forward_bf16_on_cuda() -> None:
    check_forward(torch.bfloat16, 16, 64)


def fp8_edge_keys(count: int, head_dim: int) -> torch.Tensor:
    """``[count, kv_heads, head_dim]`` keys over many magnitudes, with the cases rounding
    gets wrong: past the largest value, halfway ties, subnormals, tiny values, -0."""
    magnitudes = torch.logspace(-6, 5, count)[:, None, None]
    keys = torch.randn(count, NUM_KV_HEADS, head_dim, generator=torch.Generator().manual_seed(7))
    edges = [448.0, 464.0, 480.0, 1e6, -1e6, 57344.0, 61440.0, 2**-9 * 0.5, 2**-9 * 1.5]
    edges += [2**-9 * 2.5, 2**-6 * (1 + 1 / 16), 2**-6 * (1 + 3 / 16), 2**-16 * 1.5, -0.0]
    keys = keys * magnitudes
    keys[0, 0, : len(edges)] = torch.tensor(edges)
    return keys.to(DEVICE)


@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("scales", [KVScales(), FP8_SCALES])
def test_store_kv_fp8_equals_torch_bit_for_bit(fp8: torch.dtype, scales: KVScales) -> None:
    """The kernel's integer rounding equals torch's conversion (the interpreter's own fp8
    casts do not), saturating instead of overflowing."""
    key, value = fp8_edge_keys(40, 32), randn(40, NUM_KV_HEADS, 32, dtype=torch.float32, seed=2)
    cache = torch.zeros(2, 8, 8, NUM_KV_HEADS, 32, dtype=fp8, device=DEVICE)
    expected = cache.clone()
    slots = torch.randperm(64, generator=torch.Generator().manual_seed(1))[:40].to(DEVICE)
    slots[3] = -1
    triton_kernels.store_kv(key, value, cache, slots, scales)
    torch_ops.store_kv(key, value, expected, slots, True, scales)
    assert torch.equal(cache.view(torch.uint8), expected.view(torch.uint8))
    assert not cache.float().isnan().any()


@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize(
    ("dtype", "block_size", "head_dim"), [(torch.float32, 16, 32), (torch.float16, 8, 24)]
)
def test_fp8_decode_and_prefill_match_torch(
    fp8: torch.dtype, dtype: torch.dtype, block_size: int, head_dim: int
) -> None:
    """Both kernels reading an fp8 cache against the torch path reading the same bytes."""
    cache = make_cache(16, block_size, head_dim, torch.float32).to(fp8)
    seq_lens, query_lens = [17, 37, 5], [17, 12, 1]
    tables = make_block_tables(seq_lens, block_size, 16)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    scale = head_dim**-0.5
    query = randn(3, NUM_HEADS, head_dim, dtype=dtype, seed=3)
    decode = triton_decode.paged_decode_attention(
        query, cache, tables, lens, 37, scale, scales=FP8_SCALES
    )
    assert_close(
        decode, torch_ops.paged_decode_attention(query, cache, tables, lens, 37, scale, FP8_SCALES)
    )
    starts = [0, 17, 29, 30]
    chunks = randn(starts[-1], NUM_HEADS, head_dim, dtype=dtype, seed=4)
    out = triton_kernels.prefill_attention(
        chunks,
        cache,
        tables,
        torch.tensor(starts, dtype=torch.int32, device=DEVICE),
        lens,
        max(query_lens),
        scale,
        scales=FP8_SCALES,
    )
    for i, seq_len in enumerate(seq_lens):
        chunk = chunks[starts[i] : starts[i + 1]]
        expected = torch_ops.prefill_attention(chunk, cache, tables[i], seq_len, scale, FP8_SCALES)
        assert_close(out[starts[i] : starts[i + 1]], expected)


@pytest.mark.parametrize("fp8", FP8)
def test_forward_fp8_mixed_batch_matches_torch_backend(fp8: torch.dtype) -> None:
    check_forward(torch.float32, 16, 32, fp8)


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_forward_fp8_on_cuda_matches_torch(fp8: torch.dtype, dtype: torch.dtype) -> None:
    """The compiled kernels on a GPU (bf16 tensor-core dots, the GPU's own integer ops)
    against the torch path on the same device: same bytes stored, same attention."""
    check_forward(dtype, 16, 64, fp8)
    check_forward(dtype, 8, 128, fp8)
