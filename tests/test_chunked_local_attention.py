"""Chunked local attention (``AttentionOptions.chunk_size``, Llama 4's rope layers): the
query at position ``p`` sees only keys in ``[floor(p / chunk) * chunk, p]``.

One mixed step over a shuffled paged cache with partial blocks and GQA: a fresh prompt
longer than two chunks, a prefill chunk over a cached prefix that starts inside a chunk
and crosses into the next, and decodes at a chunk's first position (sees itself only), at
its last, and further on. The torch path is checked against a dense softmax written out
here, the native CPU backend (its decodes routed to the torch path) and the Triton
kernels (under ``TRITON_INTERPRET=1`` without a GPU: prefill, single-pass and split
decode) against the torch path.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from octavo.attention import triton_decode, triton_kernels
from octavo.attention.backend import TorchAttention
from octavo.attention.cpu_native import NativeCpuAttention
from octavo.attention.options import AttentionOptions
from octavo.attention.triton_backend import TritonAttention
from test_attention_options import Step, build_step

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
SHAPE = (4, 2, 16, 8)  # heads, kv_heads, head_dim, block_size
CHUNK = 8
SCALE = 16**-0.5
# (context length, query length): a fresh 21-token prompt, 13 queries from position 12
# (inside chunk 1) into chunk 3, decodes at positions 16 (a chunk's first), 23 (its last),
# 30 and 5 (in the first chunk)
SEQUENCES = [(21, 21), (25, 13), (17, 1), (24, 1), (31, 1), (6, 1)]
OPTIONS = {
    "chunk": AttentionOptions(chunk_size=CHUNK),
    "chunk_and_window": AttentionOptions(sliding_window=5, chunk_size=CHUNK),
    "chunk_soft_cap_sinks": AttentionOptions(
        soft_cap=2.0, sinks=torch.tensor([0.5, -1.0, 2.0, 0.0]), chunk_size=CHUNK
    ),
    # chunks that start inside cache blocks and span two of the split kernel's tiles
    "chunk12_sinks": AttentionOptions(sinks=torch.tensor([0.5, -1.0, 2.0, 0.0]), chunk_size=12),
}


def dense_reference(step: Step, options: AttentionOptions) -> torch.Tensor:
    """Float64 softmax over each sequence's whole history, keys outside the query's chunk
    (and window) masked; sinks as one more logit per head."""
    outputs = []
    for (context, query_len), (keys, values), first in zip(
        SEQUENCES, step.history, step.meta.query_start_loc_list, strict=False
    ):
        query_pos = torch.arange(context - query_len, context)[:, None]
        key_pos = torch.arange(context)[None, :]
        chunk = options.chunk_size
        visible = (key_pos <= query_pos) & (key_pos >= query_pos // chunk * chunk)
        if options.sliding_window is not None:
            visible &= key_pos > query_pos - options.sliding_window
        query = step.query[first : first + query_len]
        outputs.append(dense_heads(query, keys, values, visible, options))
    return torch.cat(outputs)


def dense_heads(query, keys, values, visible, options) -> torch.Tensor:
    heads, kv_heads = query.shape[1], keys.shape[1]
    out = torch.empty(query.shape, dtype=torch.float64)
    for head in range(heads):
        kv = head // (heads // kv_heads)
        scores = query[:, head].double() @ keys[:, kv].double().T * SCALE
        if options.soft_cap is not None:
            scores = options.soft_cap * torch.tanh(scores / options.soft_cap)
        scores = scores.masked_fill(~visible, float("-inf"))
        if options.sinks is not None:
            scores = torch.cat([scores, options.sinks[head].double().expand(len(scores), 1)], 1)
        probs = torch.softmax(scores, dim=1)[:, : keys.shape[0]]
        out[:, head] = probs @ values[:, kv].double()
    return out


def run(backend, step: Step, options: AttentionOptions) -> torch.Tensor:
    cache = step.cache.clone()
    return backend.forward(
        step.query, step.key, step.value, cache, step.meta, SCALE, options=options
    )


@pytest.fixture(scope="module")
def step() -> Step:
    return build_step(SHAPE, SEQUENCES, torch.float32)


@pytest.fixture(scope="module")
def device_step(step) -> Step:
    """The step on the Triton kernels' device (the CPU under the interpreter)."""
    meta = dataclasses.replace(
        step.meta,
        slot_mapping=step.meta.slot_mapping.to(DEVICE),
        block_tables=step.meta.block_tables.to(DEVICE),
        seq_lens=step.meta.seq_lens.to(DEVICE),
        query_start_loc=step.meta.query_start_loc.to(DEVICE),
        backend_cache={},
    )
    moved = (step.query, step.key, step.value, step.cache)
    return Step(*(tensor.to(DEVICE) for tensor in moved), meta, step.history)


@pytest.mark.parametrize("name", list(OPTIONS))
def test_torch_path_matches_the_dense_reference(step, name):
    out = run(TorchAttention(), step, OPTIONS[name])
    expected = dense_reference(step, OPTIONS[name])
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


def test_the_chunk_changes_the_answer(step):
    """Every sequence reaches past its first chunk, so a backend ignoring the option fails."""
    plain = run(TorchAttention(), step, AttentionOptions())
    chunked = run(TorchAttention(), step, OPTIONS["chunk"])
    first = step.meta.query_start_loc_list
    for index, (context, _) in enumerate(SEQUENCES):
        last = first[index + 1] - 1
        moved = (plain[last] - chunked[last]).abs().max()
        assert (moved > 1e-3) == (context > CHUNK), index


def test_decode_plans_are_kept_per_chunk(step):
    """The torch decode plan of a chunked layer is its own, beside the full layers' plan."""
    run(TorchAttention(), step, AttentionOptions())
    run(TorchAttention(), step, OPTIONS["chunk"])
    assert {("decode_plan", None), ("decode_plan", None, CHUNK)} <= set(step.meta.backend_cache)


@pytest.mark.parametrize("name", ["chunk", "chunk_soft_cap_sinks"])
def test_native_backend_routes_chunked_decodes_to_the_torch_path(ops, step, name):
    out = run(NativeCpuAttention(ops), step, OPTIONS[name])
    expected = run(TorchAttention(), step, OPTIONS[name])
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name", ["chunk", "chunk_and_window"])
def test_triton_backend_matches_the_torch_path(step, device_step, name):
    """One prefill launch (both chunks) and one single-pass decode launch."""
    out = run(TritonAttention(), device_step, OPTIONS[name])
    expected = run(TorchAttention(), step, OPTIONS[name])
    torch.testing.assert_close(out.cpu(), expected, atol=1e-4, rtol=1e-4)


def test_triton_split_decode_matches_the_torch_path(step, device_step):
    """The split-KV decode kernel (two splits) with sinks and chunks of 12: the decodes at
    positions 16 and 23 see keys from 12 on, over two tiles (8 tokens; 16 on a GPU)."""
    options = OPTIONS["chunk12_sinks"]
    meta, first = device_step.meta, device_step.meta.num_prefills
    cache = device_step.cache.clone()
    triton_kernels.store_kv(device_step.key, device_step.value, cache, meta.slot_mapping)
    queries = device_step.query[meta.num_prefill_tokens :]
    lens = meta.seq_lens[first:]
    args = (queries, cache, meta.block_tables[first:], lens, int(lens.max()), SCALE)
    tile = 16 if DEVICE.type == "cuda" else 8
    split = triton_decode.paged_decode_attention(*args, options=options, num_splits=2, kv_tile=tile)
    expected = run(TorchAttention(), step, options)[meta.num_prefill_tokens :]
    torch.testing.assert_close(split.cpu(), expected, atol=1e-4, rtol=1e-4)


def test_invalid_chunk_is_refused(step):
    query = step.query[:1]
    with pytest.raises(ValueError, match="chunk_size"):
        triton_kernels.kernel_options(AttentionOptions(chunk_size=0), query)
