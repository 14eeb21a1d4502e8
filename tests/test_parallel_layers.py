"""The linear-layer library's tensor-parallel shards, checked without processes: each rank's
layer is built under its group, loads its slice of a full checkpoint tensor, and the
ranks' outputs — concatenated (column), summed (row) or masked and summed (vocabulary) —
must equal the unsharded layer's. (Running the ranks as processes over gloo comes with
tensor parallelism itself.)"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

from octavo.distributed import parallel_state
from octavo.distributed.parallel_state import TensorParallelGroup
from octavo.kernels.cpu_features import DENSE_ENV
from octavo.model_executor.layers import dense_linear as dense_linear_module
from octavo.model_executor.layers.dense_linear import is_dense
from octavo.model_executor.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from octavo.model_executor.layers.linear_method import can_pack
from octavo.model_executor.layers.vocab import VocabParallelEmbedding


@contextlib.contextmanager
def rank_of(rank: int, size: int):
    parallel_state.set_tensor_parallel_group(TensorParallelGroup(rank, size))
    try:
        yield
    finally:
        parallel_state.set_tensor_parallel_group(TensorParallelGroup())


def on_ranks(size: int, build):
    layers = []
    for rank in range(size):
        with rank_of(rank, size):
            layers.append(build())
    return layers


def test_shards_and_their_errors():
    assert TensorParallelGroup(1, 4).shard(8, "heads") == (2, 4)
    with pytest.raises(ValueError, match=r"heads \(9\) is not divisible by tensor_parallel_size 2"):
        TensorParallelGroup(0, 2).shard(9, "heads")
    with pytest.raises(ValueError, match="rank 2 outside a group of 2"):
        TensorParallelGroup(2, 2)


def test_column_and_row_parallel_halves_compose_to_the_full_mlp():
    torch.manual_seed(0)
    gate_up, down, x = torch.randn(2 * 12, 8), torch.randn(8, 12), torch.randn(3, 8)
    expected = F.linear(F.silu(x @ gate_up[:12].T) * (x @ gate_up[12:].T), down)
    total = torch.zeros(3, 8)
    for merged, row in zip(
        on_ranks(2, lambda: MergedColumnParallelLinear(8, [12, 12])),
        on_ranks(2, lambda: RowParallelLinear(12, 8)),
        strict=True,
    ):
        merged.weight_loader(merged.weight, gate_up[:12], "gate", 0)
        merged.weight_loader(merged.weight, gate_up[12:], "up", 1)
        row.weight_loader(row.weight, down, "down")
        g, u = merged(x).chunk(2, dim=-1)
        total += row.method.apply(row, F.silu(g) * u)  # the all-reduce, by hand
    torch.testing.assert_close(total, expected)


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])  # 1 < ranks: the KV head is replicated
def test_qkv_heads_split_across_ranks(num_kv_heads):
    torch.manual_seed(1)
    heads, head_dim, hidden = 4, 3, 6
    q = torch.randn(heads * head_dim, hidden)
    k, v = (torch.randn(num_kv_heads * head_dim, hidden) for _ in range(2))
    bias = {name: torch.randn(t.shape[0]) for name, t in (("q", q), ("k", k), ("v", v))}
    x = torch.randn(2, hidden)
    ranks = on_ranks(2, lambda: QKVParallelLinear(hidden, head_dim, heads, num_kv_heads, bias=True))
    queries, keys = [], []
    for layer in ranks:
        for shard, weight in (("q", q), ("k", k), ("v", v)):
            layer.weight_loader(layer.weight, weight, shard, shard)
            layer.weight_loader(layer.bias, bias[shard], shard, shard)
        out = layer(x)
        queries.append(out[:, : layer.q_size])
        keys.append(out[:, layer.q_size : layer.q_size + layer.kv_size])
    torch.testing.assert_close(torch.cat(queries, dim=-1), F.linear(x, q, bias["q"]))
    full_k = F.linear(x, k, bias["k"])
    if num_kv_heads >= 2:
        torch.testing.assert_close(torch.cat(keys, dim=-1), full_k)
    else:
        assert all(torch.allclose(piece, full_k) for piece in keys)


def test_vocab_parallel_embedding_masks_what_other_ranks_hold(monkeypatch):
    table, ids = torch.randn(10, 4), torch.tensor([0, 4, 5, 9])
    monkeypatch.setattr(TensorParallelGroup, "all_reduce", lambda self, t: t)  # summed below
    total = torch.zeros(4, 4)
    for embed in on_ranks(2, lambda: VocabParallelEmbedding(10, 4)):
        embed.weight_loader(embed.weight, table, "embed")
        total += embed(ids)
    torch.testing.assert_close(total, table[ids])


@pytest.mark.skipif(
    not can_pack(torch.bfloat16, torch.device("cpu")),
    reason="this CPU cannot prepack bf16 weights for oneDNN (needs AVX-512 BW/VL/DQ or "
    "AVX-NE-CONVERT); the panel-kernel case runs in test_prepacked_bf16_on_the_panel_kernel",
)
def test_prepacked_bf16_for_onednn_equals_the_plain_matmul(monkeypatch):
    monkeypatch.setenv(DENSE_ENV, "0")
    layer = ColumnParallelLinear(64, 96, bias=True).to(torch.bfloat16)
    layer.weight.normal_()
    layer.bias.normal_()
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    expected = F.linear(x, layer.weight, layer.bias)
    layer.process_weights_after_loading()
    assert layer.weight is None and not is_dense(layer.packed_weight)
    torch.testing.assert_close(layer(x).float(), expected.float(), atol=0.1, rtol=0.02)


@pytest.mark.parametrize("rows", [1, 9])
def test_prepacked_bf16_on_the_panel_kernel(ops, monkeypatch, rows):
    """bf16 packs for the panel kernel on CPUs without AMX (``dense_ops``); fp32 inputs (as
    a model in bf16 never passes, but a caller might) are converted, and so is the output,
    back to the caller's dtype."""
    monkeypatch.setattr(dense_linear_module, "cpu_flags", lambda: frozenset({"avx2"}))
    layer = ColumnParallelLinear(64, 96, bias=True).to(torch.bfloat16)
    layer.weight.normal_()
    layer.bias.normal_()
    x = torch.randn(rows, 64, dtype=torch.bfloat16)
    expected = F.linear(x.double(), layer.weight.double(), layer.bias.double())
    layer.process_weights_after_loading()
    assert layer.weight is None and is_dense(layer.packed_weight)
    assert layer.packed_weight.dtype == torch.bfloat16
    torch.testing.assert_close(layer(x).double(), expected, atol=1e-3, rtol=2**-8)
    from_fp32 = layer(x.float())
    assert from_fp32.dtype == torch.float32
    torch.testing.assert_close(from_fp32.double(), expected, atol=1e-3, rtol=2**-8)


def test_bf16_on_amx_cpus_goes_where_amx_tiles_run(ops, monkeypatch):
    """Where the CPU has AMX, bf16 runs on the panel kernel only where the kernel runs its
    AMX tiles; with them off (``OCTAVO_CPU_AMX=0``, or a build without them) on oneDNN."""
    monkeypatch.setattr(dense_linear_module, "cpu_flags", lambda: frozenset({"amx_bf16"}))
    monkeypatch.setenv("OCTAVO_CPU_AMX", "0")
    assert dense_linear_module.dense_ops(torch.bfloat16, torch.device("cpu")) is None
    assert dense_linear_module.dense_ops(torch.float32, torch.device("cpu")) is ops
    monkeypatch.setenv("OCTAVO_CPU_AMX", "1")
    on_amx = dense_linear_module.dense_ops(torch.bfloat16, torch.device("cpu"))
    assert (on_amx is ops) is ops.dense_amx_enabled()


@pytest.mark.parametrize("dense", [True, False], ids=["panel-kernel", "onednn"])
@pytest.mark.parametrize("rows", [1, 7, 32, 130])
def test_prepacked_fp32_equals_the_plain_matmul(ops, monkeypatch, rows, dense):
    """fp32 packs for the native panel kernel (``OCTAVO_CPU_DENSE=0``: for oneDNN, on every
    CPU torch's oneDNN runs on, AVX2 included); any row count."""
    monkeypatch.setenv(DENSE_ENV, "1" if dense else "0")
    layer = ColumnParallelLinear(96, 40, bias=True)
    layer.weight.normal_()
    layer.bias.normal_()
    x = torch.randn(rows, 96)
    expected = F.linear(x, layer.weight, layer.bias)
    layer.process_weights_after_loading()
    assert layer.weight is None and layer.packed_weight is not None
    assert is_dense(layer.packed_weight) is dense
    torch.testing.assert_close(layer(x), expected, atol=1e-4, rtol=1e-5)
    wider = torch.cat([x, torch.randn(rows, 8)], dim=1)  # a strided view, as after a split
    torch.testing.assert_close(layer(wider[:, :96]), expected, atol=1e-4, rtol=1e-5)
    batched = layer(x.view(1, rows, 96))
    torch.testing.assert_close(batched, expected.view(1, rows, 40), atol=1e-4, rtol=1e-5)


def test_prepacking_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("OCTAVO_CPU_PREPACK", "0")
    layer = ColumnParallelLinear(16, 8, bias=False)
    layer.process_weights_after_loading()
    assert layer.packed_weight is None and layer.weight is not None
