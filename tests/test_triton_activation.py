"""The GPU gated-activation kernel equals the torch path (SiLU, Gemma's GeLU-tanh, gpt-oss's
clamped SwiGLU). Without a GPU it runs under ``TRITON_INTERPRET=1`` on CPU tensors."""

from __future__ import annotations

import os
import sys

import torch

if not torch.cuda.is_available():  # must be set before triton is first imported
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("triton was imported before this module: run with TRITON_INTERPRET=1")
    os.environ["TRITON_INTERPRET"] = "1"

import pytest

from octavo.model_executor.layers.activation import (
    ClampedSwigluAndMul,
    GeluTanhAndMul,
    SiluAndMul,
)
from octavo.model_executor.layers.triton_activation import gated_activation_triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TORCH_PATHS = {
    "silu": SiluAndMul.forward_native,
    "gelu_tanh": GeluTanhAndMul.forward_native,
    "clamped_swiglu": ClampedSwigluAndMul().forward_native,
}


@pytest.mark.parametrize("kind", sorted(TORCH_PATHS))
@pytest.mark.parametrize("shape", [(1, 2 * 8), (5, 2 * 1100), (0, 2 * 16)])
def test_kernel_equals_the_torch_path(kind, shape):
    torch.manual_seed(0)
    x = (torch.randn(shape) * 6).to(DEVICE)  # wide enough to reach the SwiGLU clamps
    expected = TORCH_PATHS[kind](x)
    assert torch.allclose(gated_activation_triton(x, kind), expected, rtol=1e-5, atol=1e-5)


def test_a_strided_row_view_and_bad_input():
    x = torch.randn(4, 2 * 40, device=DEVICE)[:, :64]  # rows longer than the view: stride 80
    assert torch.allclose(gated_activation_triton(x, "silu"), SiluAndMul.forward_native(x))
    with pytest.raises(ValueError, match="unknown gated activation"):
        gated_activation_triton(x, "relu")
    with pytest.raises(ValueError, match=r"\[tokens, 2d\]"):
        gated_activation_triton(torch.randn(3, 5, device=DEVICE), "silu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none on CI)")
def test_modules_take_the_kernel_on_gpu():
    x = torch.randn(7, 2 * 256, device="cuda", dtype=torch.bfloat16)
    for module in (SiluAndMul(), GeluTanhAndMul(), ClampedSwigluAndMul()):
        expected = module.forward_native(x).float()
        assert torch.allclose(module(x).float(), expected, rtol=2e-2, atol=2e-2)
