"""The multi-LoRA Triton kernels (shrink, expand) against ``LoRALinear``'s torch path.

Without a GPU the kernels run under ``TRITON_INTERPRET=1`` on CPU tensors (small shapes,
the Triton path forced on); with one, the same tests run compiled on CUDA tensors, plus
bf16. Rows mix two adapters and the base model, out of order, over more than one tile.
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

from octavo.model_executor.layers import lora
from octavo.model_executor.layers.linear import (
    LinearBase,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from octavo.model_executor.layers.lora import LoRABatch, LoRALinear, LoRASize, LoRAState
from octavo.model_executor.layers.lora_kernels import lora_expand, lora_shrink

DEVICE = (
    torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
)  # as x.device
DTYPES = [torch.float32] + ([torch.bfloat16] if torch.cuda.is_available() else [])
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 3e-2}
ROWS = 19  # two row tiles
GROUPS = {0: [0, 3, 5, 17, 18], 2: [1, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]}  # 2, 4: base
BASE_ROWS = [2, 4]
MAX_RANK = 20  # two rank tiles; the adapters use 4 and 18 of them


class DoublingGroup:
    """A stand-in for two identical ranks: ``all_reduce`` doubles, and counts its calls."""

    size = 2  # as many ranks as the doubling stands for

    def __init__(self) -> None:
        self.shapes: list[tuple[int, ...]] = []

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        self.shapes.append(tuple(tensor.shape))
        return tensor.mul_(2)


def lora_layer(
    base: LinearBase, modules: tuple[str, ...], targets: dict[int, set[str]], whole_input: int
) -> LoRALinear:
    """``base`` with random weights and adapters in slots 0 and 2 (slot 1 empty)."""
    gen = torch.Generator().manual_seed(len(modules))
    base.weight.copy_(torch.randn(base.weight.shape, generator=gen))
    start = getattr(base, "input_start", None)
    size = LoRASize(3, MAX_RANK, torch.float32, torch.device("cpu"))
    layer = LoRALinear(base, lora.lora_slices(base, modules), start, size, LoRAState())
    for slot, rank in ((0, 4), (2, 18)):
        weights = {}
        for piece in layer.slices:
            if piece.module in targets[slot]:
                a = torch.randn(rank, whole_input, generator=gen)
                b = torch.randn(piece.start + piece.size, rank, generator=gen)
                weights[piece.module] = (a, b)
        layer.set_slot(slot, weights, scaling=0.5)
    return layer


def batch_on(device: torch.device) -> LoRABatch:
    return LoRABatch([(slot, torch.tensor(rows, device=device)) for slot, rows in GROUPS.items()])


def both_paths(layer: LoRALinear, dtype: torch.dtype, monkeypatch) -> tuple[torch.Tensor, ...]:
    """(base output, torch path on CPU, Triton path on DEVICE), all float32 on CPU."""
    x = torch.randn(ROWS, layer.base.input_size, generator=torch.Generator().manual_seed(1))
    layer.state.batch = batch_on(torch.device("cpu"))
    expected = layer.to(dtype)(x.to(dtype)).float()
    monkeypatch.setattr(lora, "use_triton", lambda x: True)
    layer.to(DEVICE)
    base = layer.base(x.to(DEVICE, dtype)).float().cpu()  # the same device's GEMM as `actual`
    layer.state.batch = batch_on(DEVICE)
    actual = layer(x.to(DEVICE, dtype)).float().cpu()
    return base, expected, actual


def assert_close(base: torch.Tensor, expected: torch.Tensor, actual: torch.Tensor, dtype) -> None:
    assert torch.equal(actual[BASE_ROWS], base[BASE_ROWS]), "rows of the base model untouched"
    adapted = [row for row in range(ROWS) if row not in BASE_ROWS]
    assert (expected[adapted] - base[adapted]).abs().amax(dim=1).gt(0).all(), "deltas present"
    error = (actual - expected).abs().max()
    assert error <= TOLERANCE[dtype] * expected.abs().max(), f"max error {error}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_layer_of_three_unequal_slices(dtype, monkeypatch):
    modules = ("gate_proj", "up_proj", "extra_proj")
    base = MergedColumnParallelLinear(40, [40, 20, 6])  # K: a partial tile; N: 2 tiles, 1, 1
    targets = {0: set(modules), 2: {"gate_proj", "extra_proj"}}
    layer = lora_layer(base, modules, targets, whole_input=40)
    base_out, expected, actual = both_paths(layer, dtype, monkeypatch)
    assert_close(base_out, expected, actual, dtype)
    assert torch.equal(actual[GROUPS[2]][:, 40:60], base_out[GROUPS[2]][:, 40:60]), "no up_proj"


@pytest.mark.parametrize("dtype", DTYPES)
def test_qkv_layer_with_an_adapter_of_q_and_v(dtype, monkeypatch):
    modules = ("q_proj", "k_proj", "v_proj")
    base = QKVParallelLinear(48, head_dim=8, num_heads=4, num_kv_heads=2)  # q 32, k 16, v 16
    layer = lora_layer(base, modules, {0: set(modules), 2: {"q_proj", "v_proj"}}, whole_input=48)
    assert_close(*both_paths(layer, dtype, monkeypatch), dtype)


def test_row_parallel_all_reduces_the_shrunk_rows_between_the_kernels(monkeypatch):
    base = RowParallelLinear(40, 24)
    layer = lora_layer(base, ("o_proj",), {0: {"o_proj"}, 2: {"o_proj"}}, whole_input=40)
    base.tp = DoublingGroup()  # doubles the base output, and the shrunk rows on both paths
    base_out, expected, actual = both_paths(layer, torch.float32, monkeypatch)
    assert base.tp.shapes[-2:] == [(ROWS, 24), (1, ROWS, MAX_RANK)]  # base, then shrunk
    assert_close(base_out, expected, actual, torch.float32)


def test_kernels_against_an_explicit_reference():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(ROWS, 40, generator=gen)
    lora_a = torch.randn(3, 2, MAX_RANK, 40, generator=gen)
    lora_b = torch.randn(3, 30, MAX_RANK, generator=gen)
    batch = batch_on(DEVICE)
    row_slots = batch.row_slots(ROWS, DEVICE)
    assert batch.row_slots(ROWS, DEVICE) is row_slots, "made once per step"
    slots = row_slots.long().cpu()
    assert slots[BASE_ROWS].eq(-1).all() and slots[GROUPS[2]].eq(2).all()
    shrunk = lora_shrink(x.to(DEVICE), lora_a.to(DEVICE), row_slots).cpu()
    expected = torch.einsum("mk,msrk->smr", x, lora_a[slots.clamp(min=0)])
    expected[:, BASE_ROWS] = 0
    assert torch.allclose(shrunk, expected, atol=1e-4, rtol=1e-5)
    out = torch.randn(ROWS, 30, generator=gen)
    actual = lora_expand(
        out.to(DEVICE, copy=True),
        shrunk.to(DEVICE),
        lora_b.to(DEVICE),
        row_slots,
        (0, 12),
        (12, 18),
    ).cpu()
    delta = torch.einsum("smr,mnr->smn", shrunk, lora_b[slots.clamp(min=0)])
    reference = out + torch.cat([delta[0, :, :12], delta[1, :, 12:]], dim=1)
    reference[BASE_ROWS] = out[BASE_ROWS]
    assert torch.allclose(actual, reference, atol=1e-4, rtol=1e-5)
