"""The quantized GEMMs' GPU code (Triton) against the torch dequantization.

Without a GPU the kernels run under ``TRITON_INTERPRET=1`` on CPU tensors (small shapes);
with one, the same tests run compiled on CUDA tensors, plus bf16.
"""

from __future__ import annotations

import os
import sys

import torch

if not torch.cuda.is_available():  # must be set before triton is first imported
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("triton was imported before this module: run with TRITON_INTERPRET=1")
    os.environ["TRITON_INTERPRET"] = "1"

import gguf
import pytest

from octavo.model_executor.gptq_checkpoint import to_blocks
from octavo.model_executor.layers.quantization.blocks import BlockKind
from octavo.model_executor.layers.quantization.fp8 import quantize_fp8_per_row
from octavo.model_executor.layers.quantization.quantized_tensor import QuantizedTensor
from octavo.model_executor.layers.quantization.triton_int4 import Int4Planes
from octavo.model_executor.layers.quantization.triton_kernels import fp8_matmul, int4_matmul

from int4_checkpoints import gptq_tensors, quantize_groups

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPES = [torch.float32] + ([torch.bfloat16] if torch.cuda.is_available() else [])
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


def four_bit(kind: str, weight: torch.Tensor) -> QuantizedTensor:
    if kind in ("Q4_0", "Q4_1"):
        blocks = gguf.quants.quantize(weight.numpy(), gguf.GGMLQuantizationType[kind])
        return QuantizedTensor(torch.from_numpy(blocks), BlockKind[kind], weight.shape[1])
    g_idx = torch.arange(weight.shape[1]) // 64
    q, scale, zero, _ = quantize_groups(weight, g_idx)
    return to_blocks("gptq", {"group_size": 64}, gptq_tensors(q, scale, zero, g_idx))


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q4_F32"])
@pytest.mark.parametrize("rows", [1, 5, 33])
@pytest.mark.parametrize("dtype", DTYPES)
def test_int4_kernel_matches_the_dequantized_product(kind, rows, dtype):
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(72, 128, generator=generator)  # 72 outputs: a partial column tile
    tensor = four_bit(kind, weight)
    planes = Int4Planes.from_quantized(tensor)
    assert torch.equal(planes.dequantize(), tensor.dequantize())
    x = torch.randn(rows, 128, generator=generator).to(DEVICE, dtype)
    moved = [t.to(DEVICE) for t in (planes.packed, planes.scales, planes.offsets)]
    actual = int4_matmul(x, *moved).float().cpu()
    expected = x.float().cpu() @ tensor.dequantize().t()
    assert (actual - expected).abs().max() <= TOLERANCE[dtype] * expected.abs().max()


def test_int4_planes_apply_act_order_columns():
    weight = torch.randn(64, 128)
    g_idx = (torch.arange(128) // 32)[
        torch.randperm(128, generator=torch.Generator().manual_seed(0))
    ]
    q, scale, zero, dequantized = quantize_groups(weight, g_idx)
    tensor = to_blocks("gptq", {"group_size": 32}, gptq_tensors(q, scale, zero, g_idx))
    planes = Int4Planes.from_quantized(tensor)
    planes = Int4Planes(**{name: plane.to(DEVICE) for name, plane in vars(planes).items()})
    x = torch.randn(3, 128)
    actual = planes.apply(x.to(DEVICE)).cpu()  # on a GPU, Triton reads only its tensors
    assert torch.allclose(actual, x @ dequantized.t(), atol=1e-4, rtol=1e-4)


def test_other_kinds_keep_their_blocks():
    blocks = gguf.quants.quantize(torch.randn(8, 64).numpy(), gguf.GGMLQuantizationType.Q8_0)
    assert (
        Int4Planes.from_quantized(QuantizedTensor(torch.from_numpy(blocks), BlockKind.Q8_0, 64))
        is None
    )


@pytest.mark.parametrize("rows", [1, 20])
@pytest.mark.parametrize("dtype", DTYPES)
def test_fp8_kernel_matches_the_dequantized_product(rows, dtype):
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(72, 100, generator=generator)  # K not a multiple of the tile
    quantized, scale = quantize_fp8_per_row(weight)
    x = torch.randn(rows, 100, generator=generator).to(DEVICE, dtype)
    actual = fp8_matmul(x, quantized.to(DEVICE), scale.to(DEVICE)).float().cpu()
    expected = x.float().cpu() @ (quantized.float() * scale[:, None]).t()
    assert (actual - expected).abs().max() <= TOLERANCE[dtype] * expected.abs().max()
