"""Sliding window, logit soft-capping and attention sinks (``AttentionOptions``) in the torch
path and the native CPU decode kernel, against a dense softmax written out in this file.

Every case is one mixed step — a prompt with no cached prefix, a chunk over a cached
prefix, decodes of mixed lengths — over a shuffled paged cache with partial blocks, GQA
groups, a head size with a compiled specialisation (64) and one that is not a multiple of
16 (40), windows inside a block, across block edges and wider than the context.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from octavo.attention import torch_ops
from octavo.attention.backend import TorchAttention
from octavo.attention.cpu_native import NativeCpuAttention, native_options
from octavo.attention.kv_quant import UNIT_SCALES, KVScales
from octavo.attention.metadata import AttentionMetadata
from octavo.attention.options import FULL_ATTENTION, AttentionOptions

FP32_TOLERANCE = 1e-5
BF16_TOLERANCE = 2e-2
SHAPES = [  # heads, kv_heads, head_dim, block_size
    (4, 2, 64, 16),  # GQA group 2, the native kernel's 16-token chunks
    (6, 2, 40, 16),  # head size no multiple of 16: the generic kernel
    (3, 3, 64, 8),  # no GQA, block of 8: the generic kernel
]
# (context length, query length): prompt without prefix, chunk over a cached prefix, decodes
SEQUENCES = [(23, 23), (45, 9), (1, 1), (16, 1), (17, 1), (50, 1), (33, 1)]


def sinks(heads: int, seed: int = 5) -> torch.Tensor:
    return torch.randn(heads, generator=torch.Generator().manual_seed(seed)) * 2


def option_cases(heads: int) -> dict[str, AttentionOptions]:
    return {
        "full": FULL_ATTENTION,
        "window_1": AttentionOptions(sliding_window=1),
        "window_5": AttentionOptions(sliding_window=5),
        "window_21_crosses_blocks": AttentionOptions(sliding_window=21),
        "window_wider_than_context": AttentionOptions(sliding_window=1000),
        "soft_cap": AttentionOptions(soft_cap=1.5),
        "sinks": AttentionOptions(sinks=sinks(heads)),
        "window_soft_cap_sinks": AttentionOptions(
            sliding_window=12, soft_cap=2.0, sinks=sinks(heads, 6)
        ),
    }


OPTION_NAMES = list(option_cases(1))


def naive_attention(query, keys, values, positions, scale, options, scales=UNIT_SCALES):
    """Dense float64 softmax over the full key list: ``query [Q, H, D]`` at ``positions``,
    ``keys``/``values`` ``[K, kv_heads, D]`` as stored (times their scales here)."""
    heads, kv_heads = query.shape[1], keys.shape[1]
    key_pos = torch.arange(keys.shape[0])
    visible = key_pos[None, :] <= positions[:, None]
    if options.sliding_window is not None:
        visible &= key_pos[None, :] > positions[:, None] - options.sliding_window
    out = torch.empty(query.shape, dtype=torch.float64)
    for head in range(heads):
        kv = head // (heads // kv_heads)
        scores = query[:, head].double() @ (keys[:, kv].double() * scales.k).T * scale
        if options.soft_cap is not None:
            scores = options.soft_cap * torch.tanh(scores / options.soft_cap)
        scores = scores.masked_fill(~visible, float("-inf"))
        if options.sinks is not None:
            sink = options.sinks[head].double().expand(scores.shape[0], 1)
            scores = torch.cat([scores, sink], dim=1)
        probs = torch.softmax(scores, dim=1)[:, : keys.shape[0]]
        out[:, head] = probs @ (values[:, kv].double() * scales.v)
    return out


@dataclass
class Step:
    """One engine step over a paged cache: the step's q/k/v, the metadata, and every
    sequence's full key/value history (as stored) for the reference."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    cache: torch.Tensor
    meta: AttentionMetadata
    history: list[tuple[torch.Tensor, torch.Tensor]]


def build_step(shape, sequences, dtype, cache_dtype=None, seed=0) -> Step:
    heads, kv_heads, head_dim, block_size = shape
    generator = torch.Generator().manual_seed(seed)
    width = max(-(-context // block_size) for context, _ in sequences) + 1
    num_blocks = 1 + width * len(sequences)
    cache = torch.zeros(2, num_blocks, block_size, kv_heads, head_dim, dtype=cache_dtype or dtype)
    order = torch.randperm(num_blocks - 1, generator=generator) + 1
    tables = order[: width * len(sequences)].view(len(sequences), width).int().contiguous()
    queries, keys, values, slots, history = [], [], [], [], []
    for row, (context, query_len) in enumerate(sequences):
        k, v = (torch.randn(context, kv_heads, head_dim, generator=generator) for _ in "kv")
        k, v = k.to(cache.dtype).to(dtype), v.to(cache.dtype).to(dtype)  # as stored
        positions = torch.arange(context)
        blocks = tables[row, positions // block_size].long()
        seq_slots = blocks * block_size + positions % block_size
        prefix = context - query_len
        torch_ops.store_kv(k[:prefix], v[:prefix], cache, seq_slots[:prefix])
        history.append((k, v))
        keys.append(k[prefix:])
        values.append(v[prefix:])
        slots.append(seq_slots[prefix:])
        queries.append(torch.randn(query_len, heads, head_dim, generator=generator) * 3)
    query = torch.cat(queries).to(dtype)
    meta = step_metadata(sequences, tables, torch.cat(slots))
    return Step(query, torch.cat(keys), torch.cat(values), cache, meta, history)


def step_metadata(sequences, tables, slot_mapping) -> AttentionMetadata:
    query_lens = [query_len for _, query_len in sequences]
    starts = [sum(query_lens[:i]) for i in range(len(query_lens) + 1)]
    num_prefills = sum(1 for query_len in query_lens if query_len > 1)
    context_lens = [context for context, _ in sequences]
    return AttentionMetadata(
        slot_mapping=slot_mapping,
        block_tables=tables,
        seq_lens=torch.tensor(context_lens, dtype=torch.int32),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        num_prefills=num_prefills,
        num_prefill_tokens=starts[num_prefills],
        query_lens_list=query_lens,
        query_start_loc_list=starts,
        seq_lens_list=context_lens,
        max_seq_len=max(context_lens),
    )


def step_reference(step: Step, sequences, scale, options, scales=UNIT_SCALES) -> torch.Tensor:
    outputs = []
    for (context, query_len), (k, v), first in zip(
        sequences, step.history, step.meta.query_start_loc_list, strict=False
    ):
        positions = torch.arange(context - query_len, context)
        query = step.query[first : first + query_len]
        outputs.append(naive_attention(query, k, v, positions, scale, options, scales))
    return torch.cat(outputs)


def assert_close(actual, expected, tolerance):
    torch.testing.assert_close(actual.double(), expected, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", OPTION_NAMES)
def test_torch_path_matches_the_dense_reference(shape, name):
    """Prefill with and without a cached prefix and a decode batch, float32, one step."""
    options = option_cases(shape[0])[name]
    step = build_step(shape, SEQUENCES, torch.float32)
    scale = shape[2] ** -0.5
    out = TorchAttention().forward(
        step.query, step.key, step.value, step.cache, step.meta, scale, UNIT_SCALES, options
    )
    assert_close(out, step_reference(step, SEQUENCES, scale, options), FP32_TOLERANCE)


def test_long_prompt_takes_the_explicit_path_in_row_slices():
    """A prompt longer than one slice of the explicit softmax, with a window and a sink."""
    shape, sequences = (2, 1, 64, 16), [(600, 600)]
    options = AttentionOptions(sliding_window=100, soft_cap=3.0, sinks=sinks(2))
    assert sequences[0][1] > torch_ops.EXPLICIT_QUERY_ROWS
    step = build_step(shape, sequences, torch.float32)
    out = TorchAttention().forward(
        step.query, step.key, step.value, step.cache, step.meta, 0.125, UNIT_SCALES, options
    )
    assert_close(out, step_reference(step, sequences, 0.125, options), FP32_TOLERANCE)


def test_decode_plans_are_kept_per_window():
    """Layers of one model differ (Gemma alternates sliding and full): each window gets its
    own gather plan in the step's cache, and a full layer after a sliding one is still full."""
    shape = SHAPES[0]
    step = build_step(shape, SEQUENCES, torch.float32)
    backend, scale = TorchAttention(), shape[2] ** -0.5
    backend.store(step.key, step.value, step.cache, step.meta, UNIT_SCALES)
    decode_query = step.query[step.meta.num_prefill_tokens :]
    for options in (AttentionOptions(sliding_window=4), FULL_ATTENTION):
        out = backend.decode(decode_query, step.cache, step.meta, scale, UNIT_SCALES, options)
        expected = step_reference(step, SEQUENCES, scale, options)[step.meta.num_prefill_tokens :]
        assert_close(out, expected, FP32_TOLERANCE)
    assert {("decode_plan", 4), ("decode_plan", None)} <= set(step.meta.backend_cache)


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_torch_path_with_an_fp8_cache_and_every_option(fp8):
    """fp8 scales fold into the (soft-capped) scores and the output as for plain layers."""
    shape, scales = SHAPES[0], KVScales(0.37, 2.5)
    options = option_cases(shape[0])["window_soft_cap_sinks"]
    step = build_step(shape, SEQUENCES, torch.float32, cache_dtype=fp8)
    scale = shape[2] ** -0.5
    out = TorchAttention().forward(
        step.query,
        step.key * scales.k,  # the model's keys: stored as key / k_scale, i.e. the history
        step.value * scales.v,
        step.cache,
        step.meta,
        scale,
        scales,
        options,
    )
    expected = step_reference(step, SEQUENCES, scale, options, scales)
    assert_close(out, expected, FP32_TOLERANCE * 10)


# The native CPU decode kernel: fp32 against the dense reference, bf16 and fp8 caches
# against the torch path.


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", OPTION_NAMES)
def test_native_backend_matches_the_dense_reference(ops, shape, name):
    """The native backend's step: prefill on the torch path, decodes in the kernel."""
    options = option_cases(shape[0])[name]
    step = build_step(shape, SEQUENCES, torch.float32)
    scale = shape[2] ** -0.5
    out = NativeCpuAttention(ops).forward(
        step.query, step.key, step.value, step.cache, step.meta, scale, UNIT_SCALES, options
    )
    assert_close(out, step_reference(step, SEQUENCES, scale, options), FP32_TOLERANCE)


LONG_DECODES = [(1, 1), (15, 1), (16, 1), (33, 1), (300, 1), (1500, 1)]
LONG_OPTIONS = {
    "window_100": AttentionOptions(sliding_window=100),
    "window_37_soft_cap": AttentionOptions(sliding_window=37, soft_cap=1.0),
    "soft_cap_sinks": AttentionOptions(soft_cap=4.0, sinks=sinks(8)),
    "window_1_sinks": AttentionOptions(sliding_window=1, sinks=sinks(8, 9)),
}


def decode_kernel(ops, step: Step, scale, options, scales=UNIT_SCALES) -> torch.Tensor:
    out = torch.empty(step.query.shape, dtype=step.query.dtype)
    meta = step.meta
    ops.paged_decode_attention(
        out,
        step.query,
        step.cache,
        meta.block_tables,
        meta.seq_lens,
        scale,
        scales.k,
        scales.v,
        *native_options(options),
    )
    return out


def stored_decode_step(shape, dtype, cache_dtype=None) -> Step:
    step = build_step(shape, LONG_DECODES, dtype, cache_dtype)
    torch_ops.store_kv(step.key, step.value, step.cache, step.meta.slot_mapping)
    return step


@pytest.mark.parametrize("shape", [(8, 2, 64, 16), (8, 4, 40, 16), (8, 8, 128, 32)])
@pytest.mark.parametrize("name", list(LONG_OPTIONS))
def test_native_decode_on_long_contexts_matches_the_dense_reference(ops, shape, name):
    """Windows far from the start skip whole blocks; both kernel paths, float32."""
    options, scale = LONG_OPTIONS[name], shape[2] ** -0.5
    step = stored_decode_step(shape, torch.float32)
    expected = step_reference(step, LONG_DECODES, scale, options)
    assert_close(decode_kernel(ops, step, scale, options), expected, FP32_TOLERANCE)


@pytest.mark.parametrize("shape", [(8, 2, 64, 16), (8, 4, 40, 16)])
@pytest.mark.parametrize("name", list(LONG_OPTIONS))
def test_native_decode_bf16_matches_the_torch_path(ops, shape, name):
    options, scale = LONG_OPTIONS[name], shape[2] ** -0.5
    step = stored_decode_step(shape, torch.bfloat16)
    meta = step.meta
    expected = torch_ops.paged_decode_attention(
        step.query,
        step.cache,
        meta.block_tables,
        meta.seq_lens,
        meta.max_seq_len,
        scale,
        UNIT_SCALES,
        options,
    )
    actual = decode_kernel(ops, step, scale, options)
    torch.testing.assert_close(
        actual.float(), expected.float(), atol=BF16_TOLERANCE, rtol=BF16_TOLERANCE
    )


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(8, 2, 64, 16), (8, 4, 40, 16)])
def test_native_decode_fp8_cache_with_options_matches_the_torch_path(ops, fp8, dtype, shape):
    scale, scales = shape[2] ** -0.5, KVScales(0.37, 2.5)
    options = AttentionOptions(sliding_window=37, soft_cap=1.0, sinks=sinks(8))
    step = stored_decode_step(shape, dtype, fp8)
    meta = step.meta
    expected = torch_ops.paged_decode_attention(
        step.query,
        step.cache,
        meta.block_tables,
        meta.seq_lens,
        meta.max_seq_len,
        scale,
        scales,
        options,
    )
    actual = decode_kernel(ops, step, scale, options, scales)
    tolerance = FP32_TOLERANCE * 10 if dtype == torch.float32 else BF16_TOLERANCE
    torch.testing.assert_close(
        actual.float(), expected.float(), atol=tolerance * scales.v, rtol=tolerance
    )


def test_native_decode_refuses_bad_options_with_a_clear_error(ops):
    step = stored_decode_step((8, 2, 64, 16), torch.float32)
    with pytest.raises(RuntimeError, match="window must be >= 0"):
        decode_kernel(ops, step, 1.0, AttentionOptions(sliding_window=-3))
    with pytest.raises(RuntimeError, match="soft_cap must be >= 0"):
        decode_kernel(ops, step, 1.0, AttentionOptions(soft_cap=-1.0))
    with pytest.raises(RuntimeError, match=r"sinks must be .* \[heads\]"):
        decode_kernel(ops, step, 1.0, AttentionOptions(sinks=torch.zeros(3)))
