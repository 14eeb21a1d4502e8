"""Octavo's native CPU kernels (server/octavo/kernels/csrc) against the torch path.

Every kernel runs on random shapes (GQA groups, head sizes with and without a compiled
specialisation, partial last blocks, long contexts, strided inputs) in fp32 and bf16 and
must match the torch reference the engine falls back to. A machine with a C++ compiler
must build them; the fallback (no kernels) is exercised in test_greedy_matches_hf.py.
"""

from __future__ import annotations

import logging
import os

import pytest
import torch

from octavo.attention import torch_ops
from octavo.attention.backend import TorchAttention, select_backend
from octavo.attention.cpu_native import NativeCpuAttention
from octavo.attention.kv_quant import UNIT_SCALES, KVScales
from octavo.attention.options import AttentionOptions
from octavo.kernels import cpu_build, cpu_features
from octavo.model_executor.layers.activation import SiluAndMul
from octavo.model_executor.layers.dense_linear import pack_dense
from octavo.model_executor.layers.layernorm import RMSNorm
from octavo.model_executor.rotary import RotaryEmbedding, apply_rotary

DTYPES = [torch.float32, torch.bfloat16]
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 2e-2}
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
SCALES = [KVScales(), KVScales(0.37, 2.5)]  # vLLM's default, and calibrated-looking ones


def close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    torch.testing.assert_close(
        actual.float(), expected.float(), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype]
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,hidden", [(1, 576), (7, 64), (33, 1000)])
def test_rms_norm_and_fused_add(ops, dtype, tokens, hidden):
    wide = torch.randn(tokens, hidden + 16, dtype=dtype)
    x = wide[:, :hidden]  # strided rows
    norm = RMSNorm(hidden, 1e-5).to(dtype)
    norm.weight.copy_(torch.randn(hidden))
    out = torch.empty(tokens, hidden, dtype=dtype)
    ops.rms_norm(out, x, norm.weight, 1e-5)
    close(out, norm.forward_native(x), dtype)
    residual = torch.randn(tokens, hidden, dtype=dtype)
    expected_out, expected_residual = norm.forward_native(x.contiguous(), residual)
    got_out, got_residual = norm(x.contiguous(), residual.clone())
    assert torch.equal(got_residual, expected_residual)  # the add rounds exactly as torch's
    close(got_out, expected_out, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,size", [(1, 1536), (5, 100), (64, 3072)])
def test_silu_and_mul(ops, dtype, tokens, size):
    x = torch.randn(tokens, 2 * size, dtype=dtype) * 4
    close(SiluAndMul()(x), SiluAndMul.forward_native(x), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 128, 32])
def test_rotary_in_place_on_a_qkv_view(ops, dtype, head_dim):
    heads, kv_heads, tokens = 6, 2, 9
    rope = {"rope_theta": 10000.0, "rope_type": "default"}
    rotary = RotaryEmbedding(head_dim, 4096, rope, dtype, torch.device("cpu"))
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype)
    qk = qkv[:, : (heads + kv_heads) * head_dim].view(tokens, -1, head_dim)
    positions = torch.randint(0, 4096, (tokens,))
    cos, sin = rotary.tables(positions)
    expected = apply_rotary(qk, cos, sin)
    untouched = qkv[:, (heads + kv_heads) * head_dim :].clone()
    ops.rotary_embedding(positions, qk, rotary.cos, rotary.sin)
    close(qk, expected, dtype)
    assert torch.equal(qkv[:, (heads + kv_heads) * head_dim :], untouched)
    if dtype == torch.float32:  # same operations in the same order: bit-identical
        assert torch.equal(qk, expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_store_kv_skips_negative_slots(ops, dtype):
    cache = torch.zeros(2, 6, 4, 2, 16, dtype=dtype)
    expected = cache.clone()
    qkv = torch.randn(5, 6 * 16, dtype=dtype)
    key, value = qkv[:, 32:64].view(5, 2, 16), qkv[:, 64:].view(5, 2, 16)
    slots = torch.tensor([3, -1, 22, 7, 0])
    ops.store_kv(key, value, cache, slots)
    torch_ops.store_kv(key, value, expected, slots)
    assert torch.equal(cache, expected)


def random_paged_case(seq_lens, heads, kv_heads, head_dim, block_size, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    width = max(-(-n // block_size) for n in seq_lens) + 1
    num_blocks = 1 + width * len(seq_lens)
    cache = torch.randn(2, num_blocks, block_size, kv_heads, head_dim, generator=generator).to(
        dtype
    )
    order = torch.randperm(num_blocks - 1, generator=generator) + 1  # blocks shuffled, none shared
    tables = order[: width * len(seq_lens)].view(len(seq_lens), width).int().contiguous()
    qkv = torch.randn(len(seq_lens), (heads + 2 * kv_heads) * head_dim, generator=generator).to(
        dtype
    )
    query = qkv[:, : heads * head_dim].view(
        len(seq_lens), heads, head_dim
    )  # strided like the model's
    return query, cache, tables, torch.tensor(seq_lens, dtype=torch.int32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "heads,kv_heads,head_dim,block_size",
    # groups of 3, 1, 4, 4 and 7 query heads: the value sums go in blocks of up to 16 /
    # (head_dim / 16) heads (4 at 64, 3 at 80, 2 at 128), then the rest
    [
        (9, 3, 64, 16),
        (8, 8, 128, 16),
        (8, 2, 32, 8),
        (4, 1, 64, 32),
        (16, 4, 80, 16),
        (14, 2, 64, 16),
        (9, 3, 64, 128),  # vLLM's CPU block size: a chunk of keys never crosses a block
    ],
)
def test_paged_decode_attention_matches_torch(ops, dtype, heads, kv_heads, head_dim, block_size):
    seq_lens = [1, block_size, block_size + 1, 3 * block_size - 5, 1500]  # partial blocks, long
    query, cache, tables, lens = random_paged_case(
        seq_lens, heads, kv_heads, head_dim, block_size, dtype
    )
    out = torch.empty(query.shape, dtype=dtype)
    scale = head_dim**-0.5
    ops.paged_decode_attention(out, query, cache, tables, lens, scale)
    expected = torch_ops.paged_decode_attention(query, cache, tables, lens, max(seq_lens), scale)
    close(out, expected, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_walks_whole_sequences_and_single_heads_alike(ops, dtype):
    """With at least 4 sequences a thread, a decode task walks all KV heads of a sequence
    together (whole cache slots, one stream); with fewer, one (sequence, KV head) each. The
    arithmetic per head is the same: both equal the torch path and each other bit for bit,
    with a window, soft-capping and sinks too."""
    seq_lens = [1, 17, 45, 300, 1500]
    heads, kv_heads = 8, 2
    query, cache, tables, lens = random_paged_case(seq_lens, heads, kv_heads, 64, 16, dtype)
    sinks = torch.linspace(-1.0, 1.0, heads)
    threads = torch.get_num_threads()
    outs = []
    try:
        for count in (1, 2):  # 5 sequences: >= 4 a thread on one thread, < 4 on two
            torch.set_num_threads(count)
            for options in ((0, 0.0, None), (37, 2.0, sinks)):
                out = torch.empty(query.shape, dtype=dtype)
                ops.paged_decode_attention(
                    out, query, cache, tables, lens, 0.125, 1.0, 1.0, *options
                )
                outs.append(out)
    finally:
        torch.set_num_threads(threads)
    expected = torch_ops.paged_decode_attention(query, cache, tables, lens, max(seq_lens), 0.125)
    close(outs[0], expected, dtype)
    assert torch.equal(outs[0], outs[2]) and torch.equal(outs[1], outs[3])
    assert not torch.equal(outs[0], outs[1])  # the options did change the result


def decode_on_threads(ops, case, cache, count: int, options) -> torch.Tensor:
    query, _, tables, lens = case
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(count)
        out = torch.empty(query.shape, dtype=query.dtype)
        ops.paged_decode_attention(out, query, cache, tables, lens, 0.125, 1.0, 1.0, *options)
    finally:
        torch.set_num_threads(threads)
    return out


@pytest.mark.parametrize("cache_dtype", [None, torch.float8_e4m3fn])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seq_lens", [[1500], [1500, 40], [700, 1]])
def test_a_few_long_walks_are_split_across_threads_and_merged(ops, dtype, cache_dtype, seq_lens):
    """Fewer (sequence, KV head) walks than 4 a thread: each is split into parts walked by
    any thread and merged after (parts may be empty; only the first starts from the sinks).
    On one thread nothing is split: both equal the torch path, with a window, soft-capping
    and sinks too."""
    case = random_paged_case(seq_lens, 9, 3, 64, 16, dtype)
    cache = case[1] if cache_dtype is None else case[1].to(cache_dtype)
    sinks = torch.linspace(-1.0, 1.0, 9)
    for options in ((0, 0.0, None), (37, 2.0, sinks)):
        split = decode_on_threads(ops, case, cache, 2, options)
        whole = decode_on_threads(ops, case, cache, 1, options)
        close(split, whole, dtype)
    plain = decode_on_threads(ops, case, cache, 2, (0, 0.0, None))
    query, _, tables, lens = case
    expected = torch_ops.paged_decode_attention(
        query, cache.to(dtype), tables, lens, max(seq_lens), 0.125
    )
    close(plain, expected, dtype)
    assert not torch.equal(plain, split)  # the options did change the result


def fp8_edge_values(count: int, head_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """``[count, 2, head_dim]`` keys over many magnitudes, with the cases rounding gets
    wrong: past the largest value, halfway ties, subnormals, tiny values, negative zero."""
    magnitudes = torch.logspace(-6, 5, count)[:, None, None]
    keys = torch.randn(count, 2, head_dim, generator=torch.Generator().manual_seed(7)) * magnitudes
    edges = [448.0, 464.0, 480.0, 1e6, -1e6, 57344.0, 61440.0, 2**-9 * 0.5, 2**-9 * 1.5]
    edges += [2**-9 * 2.5, 2**-6 * (1 + 1 / 16), 2**-6 * (1 + 3 / 16), 2**-16 * 1.5, -0.0]
    keys[0, 0, : len(edges)] = torch.tensor(edges)
    return keys.to(dtype)


@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scales", SCALES)
def test_store_kv_fp8_equals_the_torch_path_bit_for_bit(ops, fp8, dtype, scales):
    key, value = fp8_edge_values(40, 64, dtype), torch.randn(40, 2, 64).to(dtype)
    cache = torch.zeros(2, 8, 8, 2, 64, dtype=fp8)
    expected = cache.clone()
    slots = torch.randperm(64, generator=torch.Generator().manual_seed(1))[:40]
    slots[3] = -1
    ops.store_kv(key, value, cache, slots, scales.k, scales.v)
    torch_ops.store_kv(key, value, expected, slots, True, scales)
    assert torch.equal(cache.view(torch.uint8), expected.view(torch.uint8))
    assert not cache.float().isnan().any(), "stores saturate: no NaN/inf from outliers"


@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scales", SCALES)
@pytest.mark.parametrize(
    "heads,kv_heads,head_dim,block_size", [(9, 3, 64, 16), (8, 2, 32, 8), (16, 4, 80, 16)]
)
def test_paged_decode_attention_fp8_matches_torch(
    ops, fp8, dtype, scales, heads, kv_heads, head_dim, block_size
):
    """Both kernel paths (16-token chunks; any shape) reading an fp8 cache against the torch
    path reading the same bytes: the conversion is exact, only summation order differs."""
    seq_lens = [1, block_size + 1, 3 * block_size - 5, 700]
    query, cache, tables, lens = random_paged_case(
        seq_lens, heads, kv_heads, head_dim, block_size, dtype
    )
    cache = cache.float().to(fp8)
    out = torch.empty(query.shape, dtype=dtype)
    scale = head_dim**-0.5
    ops.paged_decode_attention(out, query, cache, tables, lens, scale, scales.k, scales.v)
    expected = torch_ops.paged_decode_attention(
        query, cache, tables, lens, max(seq_lens), scale, scales
    )
    tolerance = TOLERANCE[dtype]
    torch.testing.assert_close(
        out.float(), expected.float(), atol=tolerance * scales.v, rtol=tolerance
    )


# (query length, context length): a fresh prompt, chunks over a cached prefix, a single
# token, exactly one tile of rows, a long context (many key chunks, uneven tile costs)
PREFILL_SEQUENCES = [(37, 37), (5, 50), (100, 300), (1, 1), (16, 16), (17, 1500)]


def random_prefill_case(heads, kv_heads, head_dim, block_size, dtype, sequences, seed=1):
    """Prefill chunks over a shuffled paged cache: query ``[tokens, heads, head_dim]``
    strided like the model's, the cache, block tables, query starts and context lengths."""
    seq_lens = [context for _, context in sequences]
    _, cache, tables, lens = random_paged_case(
        seq_lens, heads, kv_heads, head_dim, block_size, dtype, seed
    )
    tokens = sum(length for length, _ in sequences)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim).to(dtype)
    query = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    starts = torch.tensor([0, *torch.tensor([n for n, _ in sequences]).cumsum(0).tolist()])
    return query, cache, tables, starts.int(), lens


def torch_prefill(query, cache, tables, starts, lens, scale, scales=UNIT_SCALES):
    chunks = [
        torch_ops.prefill_attention(
            query[starts[i] : starts[i + 1]], cache, tables[i], int(lens[i]), scale, scales
        )
        for i in range(len(lens))
    ]
    return torch.cat(chunks)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "heads,kv_heads,head_dim,block_size",
    [
        (9, 3, 64, 16),
        (8, 8, 128, 16),
        (16, 4, 80, 16),
        (4, 1, 64, 32),
        (6, 2, 96, 8),
        (9, 3, 64, 128),
    ],
)
def test_paged_prefill_attention_matches_torch(ops, dtype, heads, kv_heads, head_dim, block_size):
    """Every prefill chunk of a step in one call: tiles of 16 (token, head) rows that end
    mid-token and mid-sequence, key chunks straddling blocks, causal edges."""
    query, cache, tables, starts, lens = random_prefill_case(
        heads, kv_heads, head_dim, block_size, dtype, PREFILL_SEQUENCES
    )
    out = torch.empty(query.shape, dtype=dtype)
    scale = head_dim**-0.5
    ops.paged_prefill_attention(out, query, cache, tables, starts, lens, scale)
    close(out, torch_prefill(query, cache, tables, starts, lens, scale), dtype)


@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("scales", SCALES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_prefill_attention_fp8_matches_torch(ops, fp8, scales, dtype):
    """An fp8 cache: k_scale folded into the softmax scale, v_scale into the output."""
    query, cache, tables, starts, lens = random_prefill_case(
        8, 2, 256, 16, dtype, [(40, 40), (9, 70)]
    )
    cache = cache.float().to(fp8)
    out = torch.empty(query.shape, dtype=dtype)
    scale = 256**-0.5
    ops.paged_prefill_attention(out, query, cache, tables, starts, lens, scale, scales.k, scales.v)
    expected = torch_prefill(query, cache, tables, starts, lens, scale, scales)
    tolerance = TOLERANCE[dtype]
    torch.testing.assert_close(
        out.float(), expected.float(), atol=tolerance * scales.v, rtol=tolerance
    )


def bf16_case(ops, kernel: str, heads: int, kv_heads: int, head_dim: int):
    """The kernel's call and the torch path's result on a bf16 case with odd key counts
    (the last key of a pair alone) and partial tiles."""
    scale = head_dim**-0.5
    if kernel == "decode":
        seq_lens = [1, 2, 17, 33, 700]
        query, cache, tables, lens = random_paged_case(
            seq_lens, heads, kv_heads, head_dim, 16, torch.bfloat16
        )
        expected = torch_ops.paged_decode_attention(
            query, cache, tables, lens, max(seq_lens), scale
        )
        return (
            query,
            expected,
            lambda out: ops.paged_decode_attention(out, query, cache, tables, lens, scale),
        )
    query, cache, tables, starts, lens = random_prefill_case(
        heads, kv_heads, head_dim, 16, torch.bfloat16, [(33, 33), (7, 41), (1, 1), (20, 300)]
    )
    expected = torch_prefill(query, cache, tables, starts, lens, scale)
    return (
        query,
        expected,
        lambda out: ops.paged_prefill_attention(out, query, cache, tables, starts, lens, scale),
    )


def outputs_by_setting(monkeypatch, variable: str, query, run) -> dict[str, torch.Tensor]:
    """``run(out)`` into a fresh bf16 output with ``variable`` set to "1", then to "0"."""
    outputs = {}
    for setting in ("1", "0"):
        monkeypatch.setenv(variable, setting)
        outputs[setting] = torch.empty(query.shape, dtype=torch.bfloat16)
        run(outputs[setting])
    return outputs


@pytest.mark.parametrize("kernel", ["decode", "prefill"])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (8, 2, 128), (4, 4, 96)])
def test_bf16_dot_path_and_fp32_path_both_match_torch(
    ops, monkeypatch, kernel, heads, kv_heads, head_dim
):
    """bf16 on a CPU with AVX512_BF16 takes the vdpbf16ps paths (decode_attention_bf16.h,
    prefill_attention_bf16.h); OCTAVO_CPU_BF16_DOT=0 runs the fp32 paths on the same
    machine. Both match the torch path; where the CPU has the instructions they differ
    (weights rounded to bf16), which shows each path ran."""
    query, expected, run = bf16_case(ops, kernel, heads, kv_heads, head_dim)
    outputs = outputs_by_setting(monkeypatch, "OCTAVO_CPU_BF16_DOT", query, run)
    for output in outputs.values():
        close(output, expected, torch.bfloat16)
    if cpu_build.cpu_isa() == "avx512" and "avx512_bf16" in cpu_features.cpu_flags():
        assert not torch.equal(outputs["1"], outputs["0"])


AMX = {"amx_bf16", "amx_tile"} <= cpu_features.cpu_flags()
# Decode lengths around the 16-key chunks and 64-key spans, and one long context.
MANY_DECODES = [1, 15, 16, 17, 63, 64, 65, 130, 700, 33, 2, 49]


@pytest.mark.skipif(not AMX, reason="the AMX tile runs only on CPUs with AMX-BF16 (Xeon 4th gen+)")
@pytest.mark.parametrize(
    "heads,kv_heads,head_dim,block_size,window,soft_cap,sinks",
    [
        (9, 3, 64, 16, 0, 0.0, False),
        (8, 2, 128, 32, 0, 0.0, False),
        (16, 8, 96, 48, 0, 0.0, False),
        (4, 4, 64, 16, 50, 0.0, False),
        (6, 2, 64, 16, 0, 30.0, True),
        (2, 1, 256, 16, 7, 0.0, False),
    ],
)
def test_amx_prefill_tile_matches_torch(
    ops, monkeypatch, heads, kv_heads, head_dim, block_size, window, soft_cap, sinks
):
    """bf16 prefill on a CPU with AMX tiles (prefill_attention_amx.h: 32-row tasks, 64-key
    spans from multiples of 32, the next span's scores issued before a span's sums, values
    transposed per call, masked edges): equal to the torch path in fp32 within bf16
    rounding, and to the vdpbf16ps tile (OCTAVO_CPU_AMX=0) as closely; the two differ where
    the summation order does, which shows each ran."""
    if cpu_build.cpu_isa() != "avx512":
        pytest.skip(reason="the AMX tile is built only into the AVX-512 kernels (OCTAVO_CPU_ISA)")
    sequences = [(37, 37), (5, 50), (100, 300), (1, 1), (16, 16), (17, 1500)]
    query, cache, tables, starts, lens = random_prefill_case(
        heads, kv_heads, head_dim, block_size, torch.bfloat16, sequences
    )
    sink_logits = torch.randn(heads) if sinks else None
    options = AttentionOptions(
        sliding_window=window or None, soft_cap=soft_cap or None, sinks=sink_logits
    )
    scale = head_dim**-0.5
    expected = torch.cat(
        [
            torch_ops.prefill_attention(
                query[starts[i] : starts[i + 1]].float(),
                cache.float(),
                tables[i],
                int(lens[i]),
                scale,
                options=options,
            )
            for i in range(len(lens))
        ]
    )
    outputs = outputs_by_setting(
        monkeypatch,
        "OCTAVO_CPU_AMX",
        query,
        lambda out: ops.paged_prefill_attention(
            out, query, cache, tables, starts, lens, scale, 1.0, 1.0, window, soft_cap, sink_logits
        ),
    )
    for output in outputs.values():
        close(output, expected, torch.bfloat16)
    if not 0 < window < 32:  # a row that sees 7 keys may sum them the same way on both
        assert not torch.equal(outputs["1"], outputs["0"])


@pytest.mark.skipif(not AMX, reason="the AMX tile runs only on CPUs with AMX-BF16 (Xeon 4th gen+)")
@pytest.mark.parametrize(
    "heads,kv_heads,head_dim,block_size,window,soft_cap,sinks,seq_lens",
    [
        (9, 3, 64, 16, 0, 0.0, False, MANY_DECODES),
        (9, 3, 64, 16, 0, 0.0, False, [1500]),
        (8, 2, 128, 32, 0, 0.0, False, MANY_DECODES),
        (16, 8, 96, 48, 0, 0.0, False, MANY_DECODES),
        (4, 4, 64, 16, 50, 0.0, False, MANY_DECODES),
        (6, 2, 64, 16, 0, 30.0, True, MANY_DECODES),
        (6, 3, 64, 16, 0, 0.0, True, [900]),
        (32, 2, 256, 16, 7, 0.0, False, MANY_DECODES),
    ],
)
def test_amx_decode_spans_match_torch(
    ops, monkeypatch, heads, kv_heads, head_dim, block_size, window, soft_cap, sinks, seq_lens
):
    """bf16 decode on a CPU with AMX tiles (decode_attention_amx.h: spans of up to four
    16-key chunks, short chunks padded, sinks, soft-capping and windows): equal to the torch
    path in fp32 within bf16 rounding, and to the vdpbf16ps path (OCTAVO_CPU_AMX=0) as
    closely; the two differ where the summation order does, which shows each ran. On two
    threads one sequence of 3 KV heads is split into parts, merged after."""
    if cpu_build.cpu_isa() != "avx512":
        pytest.skip(reason="the AMX tile is built only into the AVX-512 kernels (OCTAVO_CPU_ISA)")
    query, cache, tables, lens = random_paged_case(
        seq_lens, heads, kv_heads, head_dim, block_size, torch.bfloat16
    )
    sink_logits = torch.randn(heads) if sinks else None
    options = AttentionOptions(
        sliding_window=window or None, soft_cap=soft_cap or None, sinks=sink_logits
    )
    scale = head_dim**-0.5
    expected = torch_ops.paged_decode_attention(
        query.float(), cache.float(), tables, lens, max(seq_lens), scale, options=options
    )
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        outputs = outputs_by_setting(
            monkeypatch,
            "OCTAVO_CPU_AMX",
            query,
            lambda out: ops.paged_decode_attention(
                out, query, cache, tables, lens, scale, 1.0, 1.0, window, soft_cap, sink_logits
            ),
        )
    finally:
        torch.set_num_threads(previous)
    for output in outputs.values():
        close(output, expected, torch.bfloat16)
    assert not torch.equal(outputs["1"], outputs["0"])


def test_paged_prefill_attention_refuses_bad_input(ops):
    query, cache, tables, starts, lens = random_prefill_case(4, 2, 64, 16, torch.float32, [(5, 20)])
    out = torch.empty(query.shape)
    prefill = ops.paged_prefill_attention
    with pytest.raises(RuntimeError, match="seq_len out of range"):
        prefill(out, query, cache, tables, starts, torch.tensor([4], dtype=torch.int32), 1.0)
    with pytest.raises(RuntimeError, match="query_start_loc out of range"):
        prefill(out, query, cache, tables, torch.tensor([0, 9], dtype=torch.int32), lens, 1.0)
    with pytest.raises(RuntimeError, match="query_start_loc must be int32"):
        prefill(out, query, cache, tables, starts.long(), lens, 1.0)
    with pytest.raises(RuntimeError, match="window must be >= 0"):
        prefill(out, query, cache, tables, starts, lens, 1.0, 1.0, 1.0, -1)
    narrow = torch.randn(5, 4, 40)
    with pytest.raises(RuntimeError, match="head_dim must be 64, 80, 96, 128 or 256"):
        prefill(narrow, narrow, torch.randn(2, 3, 16, 2, 40), tables, starts, lens, 1.0)


def test_native_prefill_takes_what_the_kernel_does():
    """Chunked local attention, both-ways image spans and unbuilt head sizes stay on the
    torch path; plain, windowed, soft-capped and sink layers take the kernel."""
    from octavo.attention.cpu_native import native_prefill
    from octavo.attention.metadata import AttentionMetadata
    from octavo.attention.options import FULL_ATTENTION, AttentionOptions

    meta = AttentionMetadata(
        slot_mapping=torch.zeros(3, dtype=torch.long),
        block_tables=torch.zeros(1, 1, dtype=torch.int32),
        seq_lens=torch.tensor([3], dtype=torch.int32),
        query_start_loc=torch.tensor([0, 3], dtype=torch.int32),
        num_prefills=1,
        num_prefill_tokens=3,
        query_lens_list=[3],
        query_start_loc_list=[0],
        seq_lens_list=[3],
        max_seq_len=3,
    )
    query = torch.zeros(3, 4, 64)
    assert native_prefill(query, meta, FULL_ATTENTION)
    assert native_prefill(query, meta, AttentionOptions(sliding_window=4, soft_cap=2.0))
    assert not native_prefill(query, meta, AttentionOptions(chunk_size=8))
    assert not native_prefill(torch.zeros(3, 4, 40), meta, FULL_ATTENTION)
    meta.bidirectional_spans = [[(0, 2)]]
    assert not native_prefill(query, meta, FULL_ATTENTION)


@pytest.mark.parametrize("vocab", [49152, 1000, 37])
def test_token_bitmask_matches_xgrammar(ops, vocab):
    """Structured output's mask: the native kernel equals xgrammar's own torch path, with a
    vocabulary that is not a multiple of 32, on a subset of the rows."""
    import xgrammar as xgr

    generator = torch.Generator().manual_seed(vocab)
    bitmask = torch.randint(
        -(2**31), 2**31 - 1, (5, (vocab + 31) // 32), dtype=torch.int32, generator=generator
    )
    bitmask[1] = -1  # a row that allows everything
    logits = torch.randn(5, vocab, generator=generator)
    rows = [0, 1, 3]
    expected = logits.clone()
    xgr.apply_token_bitmask_inplace(expected, bitmask, indices=rows, backend="torch_native")
    actual = logits.clone()
    ops.apply_token_bitmask(actual, bitmask, torch.tensor(rows))
    assert torch.equal(actual, expected)


def test_kernels_refuse_bad_input_with_a_clear_error(ops):
    query, cache, tables, lens = random_paged_case([5], 4, 2, 64, 16, torch.float32)
    out = torch.empty(query.shape)
    with pytest.raises(RuntimeError, match="float32 and bfloat16"):
        ops.paged_decode_attention(out.half(), query.half(), cache.half(), tables, lens, 1.0)
    with pytest.raises(RuntimeError, match="query's dtype or be float8"):
        ops.paged_decode_attention(out, query, cache.bfloat16(), tables, lens, 1.0)
    with pytest.raises(RuntimeError, match="need an fp8 cache"):
        ops.store_kv(query[:, :2], query[:, :2], cache, torch.tensor([3]), 0.5, 1.0)
    with pytest.raises(RuntimeError, match="seq_len out of range"):
        ops.paged_decode_attention(
            out, query, cache, tables, torch.tensor([999], dtype=torch.int32), 1.0
        )
    with pytest.raises(RuntimeError, match=r"position .* out of range"):
        qk = torch.randn(1, 2, 64)
        ops.rotary_embedding(torch.tensor([10]), qk, torch.ones(4, 64), torch.ones(4, 64))


def lora_case(slices: list[int], slots: int, rank: int, width: int, rows: int, dtype):
    """A LoRA layer's torch-path weights (``LoRALinear.flat_a`` / ``block_b``) with each
    slot's adapter of a smaller rank than ``rank`` (zero rows past it), ``rows`` rows
    spread over the slots and the base model (-1), and the base output to add to."""
    offsets = [sum(slices[:i]) for i in range(len(slices))]
    flat_a = torch.zeros(len(slices), slots, rank, width)
    block_b = torch.zeros(len(slices), slots, rank, sum(slices))
    for slot in range(slots):
        own = max(1, rank - slot)  # adapters of different ranks share the slots' rank
        for index, (offset, size) in enumerate(zip(offsets, slices, strict=True)):
            flat_a[index, slot, :own] = torch.randn(own, width) / width**0.5
            block_b[index, slot, :own, offset : offset + size] = torch.randn(own, size)
    row_slots = torch.randint(-1, slots, (rows,), dtype=torch.int32)
    x, out = torch.randn(rows, width).to(dtype), torch.randn(rows, sum(slices)).to(dtype)
    return flat_a, block_b, row_slots, x, out, offsets


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "slices,slots,rows", [([96, 32, 32], 4, 20), ([64], 3, 1), ([40, 24], 1, 9)]
)
def test_lora_delta_equals_the_torch_paths_gemms(ops, dtype, slices, slots, rows):
    """The decode-step kernel against the masked shrink/expand GEMMs it replaces."""
    from octavo.model_executor.layers.lora import LoRABatch
    from octavo.model_executor.layers.lora_gemm import LoRAGemms

    flat_a, block_b, row_slots, x, out, offsets = lora_case(slices, slots, 8, 72, rows, dtype)
    gemms = LoRAGemms.of(flat_a, block_b, dtype)
    groups = [(slot, (row_slots == slot).nonzero().flatten()) for slot in range(slots)]
    mask = LoRABatch(groups).column_mask(rows, flat_a.shape[:3], x.device, gemms.dtype)
    expected = gemms.expand_into(out.clone(), gemms.shrink(x, mask))
    actual = out.clone()
    weights = (flat_a.to(dtype), block_b.to(dtype))  # the layer's bf16 copies for bf16
    ops.lora_delta(actual, x, *weights, row_slots, offsets, slices)
    scale = expected.float().abs().max()
    assert torch.allclose(actual.float(), expected.float(), atol=TOLERANCE[dtype] * scale, rtol=0)
    if dtype == torch.bfloat16:  # fp32 weights with bf16 activations work too
        ops.lora_delta(fp32 := out.clone(), x, flat_a, block_b, row_slots, offsets, slices)
        assert torch.allclose(fp32.float(), expected.float(), atol=TOLERANCE[dtype] * scale, rtol=0)
    base_rows = row_slots < 0
    assert torch.equal(actual[base_rows], out[base_rows]), "base-model rows are left alone"


def test_lora_delta_refuses_bad_input(ops):
    flat_a, block_b, row_slots, x, out, offsets = lora_case([16], 2, 4, 8, 3, torch.float32)
    with pytest.raises(RuntimeError, match="has slot 5"):
        ops.lora_delta(
            out, x, flat_a, block_b, torch.tensor([0, 5, -1], dtype=torch.int32), offsets, [16]
        )
    with pytest.raises(RuntimeError, match="out of range"):
        ops.lora_delta(out, x, flat_a, block_b, row_slots, [8], [16])
    with pytest.raises(RuntimeError, match="float32"):
        ops.lora_delta(out, x, flat_a.double(), block_b, row_slots, offsets, [16])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cache_dtype", [None, torch.float8_e4m3fn])
def test_native_backend_equals_torch_backend_on_a_mixed_step(ops, dtype, cache_dtype):
    """A step with a fresh prefill, a prefill over a cached prefix and three decodes (an
    fp8 cache: stored bytes identical, outputs within the same tolerance)."""
    from octavo.attention.metadata import AttentionMetadata

    kv_heads, heads, head_dim, block_size = 2, 6, 64, 16
    cache = torch.randn(2, 40, block_size, kv_heads, head_dim).to(cache_dtype or dtype)
    scales = KVScales(0.5, 1.5) if cache_dtype else KVScales()
    tables = torch.arange(1, 41, dtype=torch.int32)[: 5 * 7].view(5, 7)[:, :7].contiguous()
    query_lens, seq_lens = [20, 10, 1, 1, 1], [20, 45, 30, 17, 100]
    starts = [0, 20, 30, 31, 32, 33]
    slots = []
    for row, (q_len, s_len) in enumerate(zip(query_lens, seq_lens, strict=True)):
        for pos in range(s_len - q_len, s_len):
            slots.append(int(tables[row, pos // block_size]) * block_size + pos % block_size)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots),
        block_tables=tables,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        num_prefills=2,
        num_prefill_tokens=30,
        query_lens_list=query_lens,
        query_start_loc_list=starts[:-1],
        seq_lens_list=seq_lens,
        max_seq_len=max(seq_lens),
    )
    query, key, value = (
        torch.randn(33, n, head_dim).to(dtype) for n in (heads, kv_heads, kv_heads)
    )
    expected_cache = cache.clone()
    expected = TorchAttention().forward(
        query, key, value, expected_cache, meta, head_dim**-0.5, scales
    )
    meta.backend_cache.clear()
    got = NativeCpuAttention(ops).forward(query, key, value, cache, meta, head_dim**-0.5, scales)
    assert torch.equal(cache.view(torch.uint8), expected_cache.view(torch.uint8))
    close(got, expected, dtype)


def test_backend_choice_follows_the_kernels(ops):
    cpu = torch.device("cpu")
    assert isinstance(select_backend(cpu, torch.bfloat16), NativeCpuAttention)
    assert type(select_backend(cpu, torch.float16)) is TorchAttention  # no fp16 kernels
    try:
        cpu_build.use_torch_path()
        assert type(select_backend(cpu, torch.float32)) is TorchAttention
        assert cpu_build.ops_for(torch.ones(1)) is None
    finally:
        cpu_build.use_torch_path(False)
    assert cpu_build.ops_for(torch.ones(1)) is not None


def test_a_failed_build_falls_back_with_a_reason(monkeypatch, caplog):
    def broken_build(plan):
        raise RuntimeError("Error building extension: c++ not found")

    monkeypatch.setattr(cpu_build, "build", broken_build)
    loader = cpu_build._Loader()
    with caplog.at_level(logging.WARNING, logger="octavo.kernels.cpu_build"):
        assert loader.ops() is None
    assert "c++ not found" in loader.reason
    assert "using the torch path" in caplog.text
    monkeypatch.setenv(cpu_build.DISABLE_ENV, "0")
    disabled = cpu_build._Loader()
    assert disabled.ops() is None and disabled.reason == "OCTAVO_NATIVE_KERNELS=0"


def test_build_is_keyed_by_sources_flags_and_isa(tmp_path, monkeypatch):
    monkeypatch.setenv(cpu_build.KERNELS_DIR_ENV, str(tmp_path))
    plans = {isa: cpu_build.plan_build(isa) for isa in cpu_build.ISA_FLAGS}
    assert len({plan.name for plan in plans.values()}) == len(plans)
    assert all(plan.folder.parent == tmp_path for plan in plans.values())
    assert cpu_build.plan_build("avx2") == plans["avx2"]  # stable: an existing build is reused


def test_a_build_killed_midway_does_not_block_the_next(tmp_path, monkeypatch):
    """torch's build lock file outlives a killed build; the next build must not wait on it."""
    monkeypatch.setenv(cpu_build.KERNELS_DIR_ENV, str(tmp_path))
    plan = cpu_build.plan_build("generic")
    plan.folder.mkdir(parents=True)
    (plan.folder / "lock").touch()  # what a build killed inside cpp_extension.load leaves

    def compile_stub(plan, cpp_extension):  # stands in for the real compiler run
        assert not (plan.folder / "lock").exists(), "the stale lock was left in place"
        plan.library.write_bytes(b"built")

    monkeypatch.setattr(cpu_build, "_compile", compile_stub)
    assert cpu_build.build(plan) == plan.library
    assert plan.library.read_bytes() == b"built"


@pytest.mark.parametrize("isa", ["avx2", "generic"])
def test_the_narrower_builds_pass_the_same_tests(ops, isa, tmp_path):
    """Machines without AVX-512 (AVX2 only, or neither) get their own build: it is compiled
    here and this file's kernel tests (and the sampling kernel's) run against it in a child
    process."""
    import subprocess
    import sys
    from pathlib import Path

    if isa == "avx2" and not {"avx2", "fma", "f16c"} <= cpu_features.cpu_flags():
        pytest.skip(reason="this CPU cannot run AVX2 code")
    if isa == cpu_build.cpu_isa():
        pytest.skip(reason=f"{isa} is this process's own build: the rest of this file tests it")
    env = {**os.environ, cpu_build.ISA_ENV: isa}
    sampling_tests = str(Path(__file__).with_name("test_cpu_sampling.py"))
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        __file__,
        sampling_tests,
    ]
    command += ["-k", "not narrower_builds", "--rootdir", str(Path(__file__).parent)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert " passed" in result.stdout
    assert cpu_build.plan_build(isa).library.exists()  # the child built and used that ISA


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 7, 8, 9, 14, 33])
@pytest.mark.parametrize("out_features,in_features", [(96, 64), (49, 33), (17, 1100)])
def test_dense_linear_matches_a_float64_matmul(ops, rows, out_features, in_features):
    """Every row count (the few-row and many-row register blocks, and their tails), output
    counts that leave a panel part-empty, input counts past one 1,024-wide slice, strided
    rows, with and without a bias."""
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(out_features, in_features, generator=generator)
    bias = torch.randn(out_features, generator=generator) if rows % 2 else None
    x = torch.randn(rows, in_features + 5, generator=generator)[:, 3 : 3 + in_features]
    out = torch.full((rows, out_features), float("nan"))
    ops.dense_linear(out, x, pack_dense(ops, weight), bias)
    expected = torch.nn.functional.linear(
        x.double(), weight.double(), None if bias is None else bias.double()
    )
    torch.testing.assert_close(out, expected.float(), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("dot", ["1", "0"], ids=["vdpbf16ps", "widened"])
@pytest.mark.parametrize("rows", [1, 4, 9, 17])
@pytest.mark.parametrize("out_features,in_features", [(96, 64), (49, 33), (40, 2100)])
def test_dense_linear_bf16_matches_fp32_sums_rounded_once(
    ops, monkeypatch, dot, rows, out_features, in_features
):
    """bf16 on input-pair panels, both ways the kernel runs it (vdpbf16ps where the CPU has
    it, else widened to fp32: OCTAVO_CPU_BF16_DOT=0 forces that): an odd input count (the
    last pair half zero), inputs past one slice (sums kept in fp32 between slices), a
    part-empty last panel, strided rows, a bias; the result is the float64 sum rounded to
    bf16, within a unit in the last place."""
    monkeypatch.setenv("OCTAVO_CPU_BF16_DOT", dot)
    monkeypatch.setenv("OCTAVO_CPU_AMX", "0")  # the AMX tiles: the test below
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(out_features, in_features, generator=generator).bfloat16()
    bias = torch.randn(out_features, generator=generator).bfloat16() if rows % 2 else None
    x = torch.randn(rows, in_features + 5, generator=generator).bfloat16()[:, 3 : 3 + in_features]
    packed = pack_dense(ops, weight)
    assert packed.shape == (
        -(-out_features // ops.dense_panel_width()),
        -(-in_features // 2),
        2 * ops.dense_panel_width(),
    )
    out = torch.full((rows, out_features), float("nan"), dtype=torch.bfloat16)
    ops.dense_linear(out, x, packed, bias)
    expected = torch.nn.functional.linear(
        x.double(), weight.double(), None if bias is None else bias.double()
    )
    torch.testing.assert_close(out.double(), expected, atol=1e-3, rtol=2**-8)


BF16_DOT_HERE = cpu_build.cpu_isa() == "avx512" and "avx512_bf16" in cpu_features.cpu_flags()
INTEL = "GenuineIntel" in cpu_features.cpu_flags()


def test_bf16_linears_widen_on_intel_from_two_rows(ops, monkeypatch):
    """Which way the bf16 linears multiply (``dense_bf16_path``): vdpbf16ps where the CPU
    has it, but on Intel from 2 rows the widened FMAs (half vdpbf16ps's rate there);
    OCTAVO_CPU_BF16_DOT=1 / 0 holds them to one way (AMX tiles off: the test below)."""
    monkeypatch.setenv("OCTAVO_CPU_AMX", "0")
    dot = "vdpbf16ps" if BF16_DOT_HERE else "widened"
    monkeypatch.delenv("OCTAVO_CPU_BF16_DOT", raising=False)
    assert ops.dense_bf16_path(1, 576) == dot
    assert ops.dense_bf16_path(64, 576) == ("widened" if INTEL else dot)
    monkeypatch.setenv("OCTAVO_CPU_BF16_DOT", "1")
    assert ops.dense_bf16_path(64, 576) == dot
    monkeypatch.setenv("OCTAVO_CPU_BF16_DOT", "0")
    assert [ops.dense_bf16_path(rows, 576) for rows in (1, 64)] == ["widened"] * 2


@pytest.mark.skipif(
    not (BF16_DOT_HERE and INTEL), reason="vdpbf16ps's order of adds is Intel's definition"
)
def test_widened_bf16_linears_equal_intels_vdpbf16ps(ops, monkeypatch):
    """The widened FMAs add the odd input's product first, as Intel defines vdpbf16ps:
    on Intel both ways give the same bf16 results (register blocks of 2 rows and up)."""
    monkeypatch.setenv("OCTAVO_CPU_AMX", "0")
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(200, 2100, generator=generator).bfloat16()
    x = torch.randn(37, 2100, generator=generator).bfloat16()
    bias = torch.randn(200, generator=generator).bfloat16()
    packed, outputs = pack_dense(ops, weight), []
    for dot in ("1", "0"):
        monkeypatch.setenv("OCTAVO_CPU_BF16_DOT", dot)
        outputs.append(torch.empty(37, 200, dtype=torch.bfloat16))
        ops.dense_linear(outputs[-1], x, packed, bias)
    assert torch.equal(outputs[0], outputs[1])


def test_bf16_prefill_attention_runs_the_fp32_tile_on_intel(ops, monkeypatch):
    """Intel cores run vdpbf16ps at half their FMA rate, so there bf16 prefill attention
    (AMX tiles off) runs the fp32 tile: the output OCTAVO_CPU_BF16_DOT=0 gives; elsewhere
    the vdpbf16ps tile where the CPU has it (where it has them the two tiles' outputs
    differ: test_bf16_dot_path_and_fp32_path_both_match_torch)."""
    monkeypatch.setenv("OCTAVO_CPU_AMX", "0")
    query, _, run = bf16_case(ops, "prefill", 9, 3, 64)
    outputs = outputs_by_setting(monkeypatch, "OCTAVO_CPU_BF16_DOT", query, run)
    monkeypatch.delenv("OCTAVO_CPU_BF16_DOT")
    default = torch.empty(query.shape, dtype=torch.bfloat16)
    run(default)
    assert torch.equal(default, outputs["1" if BF16_DOT_HERE and not INTEL else "0"])


@pytest.mark.parametrize("rows", [2, 16, 17, 40, 600])
@pytest.mark.parametrize("out_features,in_features", [(96, 64), (49, 96), (40, 2048), (600, 64)])
def test_dense_linear_bf16_on_amx_tiles(ops, monkeypatch, rows, out_features, in_features):
    """bf16 on AMX tiles (dense_linear_amx.h), from 2 rows where inputs are a multiple of
    32: one and two row tiles, a part-tile of rows, a part-empty last panel and an odd
    panel count, chunks of 512 rows, groups of 8 panel pairs and a part-group (600 columns:
    19 pairs), strided rows, a bias; the float64 sum rounded to bf16
    within two units in the last place, and the vdpbf16ps path's result too."""
    monkeypatch.setenv("OCTAVO_CPU_AMX", "1")
    if not ops.dense_amx_enabled():
        pytest.skip(reason="no AMX tiles here: the CPU lacks AMX-BF16 or this build is not AVX-512")
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(out_features, in_features, generator=generator).bfloat16()
    bias = torch.randn(out_features, generator=generator).bfloat16() if rows % 2 else None
    x = torch.randn(rows, in_features + 5, generator=generator).bfloat16()[:, 3 : 3 + in_features]
    packed = pack_dense(ops, weight)
    out = torch.full((rows, out_features), float("nan"), dtype=torch.bfloat16)
    ops.dense_linear(out, x, packed, bias)
    expected = torch.nn.functional.linear(
        x.double(), weight.double(), None if bias is None else bias.double()
    )
    # A sum near a rounding boundary may round either way in fp32 (summed in another order).
    torch.testing.assert_close(out.double(), expected, atol=1e-3, rtol=2**-7)
    monkeypatch.setenv("OCTAVO_CPU_AMX", "0")
    on_vectors = torch.empty_like(out)
    ops.dense_linear(on_vectors, x, packed, bias)
    torch.testing.assert_close(out.double(), on_vectors.double(), atol=1e-3, rtol=2**-7)


def test_dense_linear_refuses_a_mismatched_weight(ops):
    packed = pack_dense(ops, torch.randn(40, 24))
    with pytest.raises(RuntimeError, match="inputs"):
        ops.dense_linear(torch.empty(2, 40), torch.randn(2, 23), packed, None)
    with pytest.raises(RuntimeError, match="columns"):
        ops.dense_linear(torch.empty(2, 80), torch.randn(2, 24), packed, None)
    with pytest.raises(RuntimeError, match="panels"):
        wrong_width = torch.zeros(packed.shape[0], 24, packed.shape[2] * 2)
        ops.dense_linear(torch.empty(2, 40), torch.randn(2, 24), wrong_width, None)
    packed_bf16 = pack_dense(ops, torch.randn(40, 24).bfloat16())
    with pytest.raises(RuntimeError, match="bfloat16"):  # fp32 inputs against bf16 weights
        ops.dense_linear(torch.empty(2, 40), torch.randn(2, 24), packed_bf16, None)
    with pytest.raises(RuntimeError, match="inputs"):
        x = torch.randn(2, 26).bfloat16()
        ops.dense_linear(torch.empty(2, 40, dtype=torch.bfloat16), x, packed_bf16, None)
