"""The GPU RMSNorm kernel (with and without the fused residual add) equals the torch path.
Without a GPU it runs under ``TRITON_INTERPRET=1`` (conftest sets it) on CPU tensors."""

from __future__ import annotations

import pytest
import torch

from octavo.model_executor.layers.layernorm import RMSNorm
from octavo.model_executor.layers.triton_norm import rms_norm_triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def norm_of(hidden: int) -> RMSNorm:
    norm = RMSNorm(hidden, eps=1e-5).to(DEVICE)
    norm.weight.data = torch.randn(hidden, device=DEVICE)
    return norm


@pytest.mark.parametrize("shape", [(1, 8), (5, 1100), (0, 16)])
def test_kernel_equals_the_torch_path_with_and_without_a_residual(shape):
    torch.manual_seed(0)
    norm = norm_of(shape[1])
    x, residual = torch.randn(shape, device=DEVICE) * 3, torch.randn(shape, device=DEVICE)
    expected_out, expected_sum = norm.forward_native(x.clone(), residual.clone())
    assert torch.allclose(rms_norm_triton(x.clone(), norm.weight, norm.eps), norm.forward_native(x))
    # with a residual it works in place: x becomes the normed row, residual the sum
    out = rms_norm_triton(x, norm.weight, norm.eps, residual)
    assert out.data_ptr() == x.data_ptr()
    assert torch.allclose(out, expected_out, rtol=1e-5, atol=1e-5)
    assert torch.equal(residual, expected_sum)


def test_strided_rows_and_bad_input():
    norm = norm_of(64)
    x = torch.randn(4, 80, device=DEVICE)[:, :64]  # rows longer than the view: stride 80
    expected = norm.forward_native(x.contiguous())
    assert torch.allclose(rms_norm_triton(x, norm.weight, norm.eps), expected, atol=1e-6)
    with pytest.raises(ValueError, match="does not fit"):
        rms_norm_triton(torch.randn(3, 32, device=DEVICE), norm.weight, norm.eps)
    with pytest.raises(ValueError, match="does not match"):
        rms_norm_triton(x.contiguous(), norm.weight, norm.eps, torch.randn(2, 64, device=DEVICE))
    with pytest.raises(ValueError, match=r"\[tokens, hidden\]"):
        rms_norm_triton(torch.randn(2, 3, 64, device=DEVICE), norm.weight, norm.eps)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none on CI)")
def test_the_module_takes_the_kernel_on_gpu_in_bfloat16():
    norm = norm_of(2048).to(torch.bfloat16)
    x = torch.randn(7, 2048, device="cuda", dtype=torch.bfloat16)
    residual = torch.randn_like(x)
    expected_out, expected_sum = norm.forward_native(x.clone(), residual.clone())
    out, summed = norm(x, residual)
    assert out.data_ptr() == x.data_ptr() and summed.data_ptr() == residual.data_ptr()
    assert torch.equal(summed, expected_sum)
    assert torch.allclose(out.float(), expected_out.float(), rtol=2e-2, atol=2e-2)
