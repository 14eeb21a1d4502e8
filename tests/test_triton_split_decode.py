"""The split-KV ("flash-decoding") Triton decode kernel against the torch path.

Without a GPU the kernels run under ``TRITON_INTERPRET=1`` on CPU tensors (tiny shapes:
the interpreter is slow); with one, the same tests run compiled. Split counts and the
tile size are forced so that several chunks, empty chunks and both ways of reading block
ids (several blocks per tile, several tiles per block) are exercised at these lengths.
"""

from __future__ import annotations

import os
import sys

import torch

if not torch.cuda.is_available():  # must be set before triton is first imported
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("triton was imported before this module: run with TRITON_INTERPRET=1")
    os.environ["TRITON_INTERPRET"] = "1"

from dataclasses import dataclass

import pytest

from octavo.attention import torch_ops, triton_decode
from octavo.attention.kv_quant import UNIT_SCALES, KVScales
from octavo.attention.options import FULL_ATTENTION, AttentionOptions

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
HEAD_DIM, NUM_BLOCKS, KV_HEADS = 16, 24, 2
SEQ_LENS = [1, 17, 40, 9]  # a one-token row, partial blocks, a context of several tiles
FP8_SCALES = KVScales(0.37, 2.5)
NO_GPU = "needs a CUDA GPU (none here: the split kernel is checked under TRITON_INTERPRET)"
SINKS = torch.tensor([0.5, -1.0, 2.0, 0.0, 1.0, -0.5, 0.25, 3.0])


@dataclass(frozen=True)
class Case:
    """One decode launch: GQA group, cache block size, forced splits and tile, options."""

    group: int = 2
    block_size: int = 8
    num_splits: int = 3
    kv_tile: int = 16
    options: AttentionOptions = FULL_ATTENTION
    cache_dtype: torch.dtype | None = None
    scales: KVScales = UNIT_SCALES
    dtype: torch.dtype = torch.float32  # the query's (and a non-fp8 cache's)


CASES = {
    "plain": Case(),
    "more_splits_than_tiles": Case(num_splits=5),
    "group1": Case(group=1),
    "group4": Case(group=4, num_splits=2),
    "tiles_within_a_block": Case(block_size=32),  # kv_tile 16 < block_size 32
    "one_block_per_tile": Case(block_size=16),
    "window6": Case(options=AttentionOptions(sliding_window=6)),
    "window1": Case(options=AttentionOptions(sliding_window=1), num_splits=2),
    "window_over_tiles": Case(options=AttentionOptions(sliding_window=21)),
    "softcap": Case(options=AttentionOptions(soft_cap=2.0)),
    "sinks": Case(options=AttentionOptions(sinks=SINKS[:4])),
    "sinks_window": Case(options=AttentionOptions(sliding_window=6, sinks=SINKS[:4])),
    "fp8_e4m3": Case(cache_dtype=torch.float8_e4m3fn, scales=FP8_SCALES),
    "fp16": Case(dtype=torch.float16, options=AttentionOptions(soft_cap=2.0, sinks=SINKS[:4])),
}
TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-3}


def seeded(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 2.0


def tables_for(seq_lens: list[int], block_size: int, width: int) -> torch.Tensor:
    """Shuffled block ids per row (0 is the null block), padded with 0; a one-token row
    points at block 0 like the CUDA-graph padding rows."""
    ids = torch.randperm(NUM_BLOCKS - 1, generator=torch.Generator().manual_seed(1)) + 1
    table = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    used = 0
    for row, seq_len in enumerate(seq_lens):
        count = -(-seq_len // block_size) if seq_len > 1 else 0
        table[row, :count] = ids[used : used + count]
        used += count
    return table


def device_options(options: AttentionOptions) -> AttentionOptions:
    if options.sinks is None:
        return options
    return AttentionOptions(options.sliding_window, options.soft_cap, options.sinks.to(DEVICE))


def launch(case: Case, seq_lens: list[int], width: int = 6, **forced):
    """Both paths on the same inputs: ``(split kernel, torch_ops)`` outputs."""
    heads = KV_HEADS * case.group
    shape = (2, NUM_BLOCKS, case.block_size, KV_HEADS, HEAD_DIM)
    cache = seeded(*shape, seed=11).to(DEVICE, case.cache_dtype or case.dtype)
    table = tables_for(seq_lens, case.block_size, width).to(DEVICE)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    query = seeded(len(seq_lens), heads, HEAD_DIM, seed=3).to(DEVICE, case.dtype)
    options = device_options(case.options)
    args = (query, cache, table, lens, max(seq_lens), HEAD_DIM**-0.5)
    out = triton_decode.paged_decode_attention(*args, scales=case.scales, options=options, **forced)
    expected = torch_ops.paged_decode_attention(*args, case.scales, options)
    return out, expected


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    tol = TOLERANCE[expected.dtype]
    torch.testing.assert_close(actual.float(), expected.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("name", CASES)
def test_split_kernel_matches_torch(name: str) -> None:
    case = CASES[name]
    out, expected = launch(case, SEQ_LENS, num_splits=case.num_splits, kv_tile=case.kv_tile)
    assert_close(out, expected)


def test_split_kernel_equals_single_pass() -> None:
    """The same launch with one split (the single-pass kernel) and with three."""
    case = CASES["sinks_window"]
    single, _ = launch(case, SEQ_LENS, num_splits=1)
    split, _ = launch(case, SEQ_LENS, num_splits=3, kv_tile=16)
    assert_close(split, single)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("name", ["plain", "sinks"])
def test_an_empty_row_gives_zeros(num_splits: int, name: str) -> None:
    """seq_len 0 (nothing visible) neither crashes nor disturbs the other rows."""
    out, expected = launch(CASES[name], [0, *SEQ_LENS], num_splits=num_splits, kv_tile=16)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert_close(out[1:], expected[1:])


def test_the_default_split_count_comes_from_the_shape(monkeypatch) -> None:
    """Without a forced count the rule sees the table's width, not the lengths: a wide
    table (a long possible context) splits short sequences, and the answer is unchanged."""
    monkeypatch.setattr(triton_decode, "sm_count", lambda device: 64)
    assert triton_decode.choose_num_splits(4, KV_HEADS, 48 * 8, 64) == 6
    out, expected = launch(CASES["plain"], SEQ_LENS, width=48)
    assert_close(out, expected)


def test_choose_num_splits() -> None:
    """Few rows on many SMs split most (up to the context's limit), many rows split in
    two, and only a context too short for two splits keeps the single pass."""
    h200 = 132
    assert triton_decode.choose_num_splits(1, 8, 2048, h200) == 32
    assert triton_decode.choose_num_splits(32, 8, 2048, h200) == 5
    assert triton_decode.choose_num_splits(32, 8, 1024, h200) == 5
    assert triton_decode.choose_num_splits(256, 8, 1024, h200) == 2
    assert triton_decode.choose_num_splits(32, 8, 128, h200) == 2
    assert triton_decode.choose_num_splits(32, 8, 64, h200) == 1
    assert triton_decode.choose_num_splits(1, 1, 1 << 20, h200) == triton_decode.MAX_SPLITS


def test_a_split_count_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="num_splits"):
        launch(CASES["plain"], SEQ_LENS, num_splits=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
def test_a_captured_launch_replays_with_new_lengths() -> None:
    """CUDA-graph safety: a launch captured once gives the right answer when only the
    device tensors change (lengths, tables, queries), padding rows included."""
    case = CASES["sinks_window"]
    shape = (2, NUM_BLOCKS, case.block_size, KV_HEADS, HEAD_DIM)
    cache = seeded(*shape, seed=11).to(DEVICE)
    lens = torch.tensor(SEQ_LENS, dtype=torch.int32, device=DEVICE)
    table = tables_for(SEQ_LENS, case.block_size, 6).to(DEVICE)
    query = seeded(len(SEQ_LENS), 2 * KV_HEADS, HEAD_DIM, seed=3).to(DEVICE)
    options = device_options(case.options)
    args = (query, cache, table, lens, 48, HEAD_DIM**-0.5)
    launch_args = {"options": options, "num_splits": 3, "kv_tile": 16}
    triton_decode.paged_decode_attention(*args, **launch_args)  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = triton_decode.paged_decode_attention(*args, **launch_args)
    new_lens = [44, 1, 23, 1]  # rows 1 and 3: padding rows on the null block
    lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
    table.copy_(tables_for(new_lens, case.block_size, 6))
    query.copy_(seeded(len(SEQ_LENS), 2 * KV_HEADS, HEAD_DIM, seed=5))
    graph.replay()
    expected = torch_ops.paged_decode_attention(*args, UNIT_SCALES, options)
    assert_close(out, expected)
