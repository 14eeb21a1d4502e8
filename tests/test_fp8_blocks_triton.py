"""The FP8 block GEMM's GPU code (Triton, ``triton_fp8_blocks.py``) against the torch
dequantization: tiles of 16 x 32 over a 40 x 100 matrix (partial tiles both ways), and a
tensor-parallel-like slice whose rows and columns start inside tiles.

Without a GPU the kernel runs under ``TRITON_INTERPRET=1`` on CPU tensors; with one, the
same test runs compiled on CUDA tensors, plus bf16.
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

from octavo.model_executor.layers.quantization.fp8_blocks import Fp8BlockTensor
from octavo.model_executor.layers.quantization.triton_fp8_blocks import fp8_block_linear
from test_fp8_block_checkpoints import quantize_blocks

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPES = [torch.float32] + ([torch.bfloat16] if torch.cuda.is_available() else [])
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("rows", [1, 5, 33])
@pytest.mark.parametrize("dtype", DTYPES)
def test_fp8_block_kernel_matches_the_dequantized_product(rows, dtype):
    generator = torch.Generator().manual_seed(rows)
    codes, scale = quantize_blocks(torch.randn(40, 100, generator=generator), (16, 32))
    whole = Fp8BlockTensor(codes, scale, (16, 32))
    for matrix in (whole, whole.narrow(0, 5, 30).narrow(1, 20, 70)):
        x = torch.randn(rows, matrix.shape[1], generator=generator).to(DEVICE, dtype)
        actual = fp8_block_linear(x, matrix.to(DEVICE)).float().cpu()
        expected = x.float().cpu() @ matrix.dequantize().t()
        assert (actual - expected).abs().max() <= TOLERANCE[dtype] * expected.abs().max()
