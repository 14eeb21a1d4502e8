"""Gemma's RMSNorm and the gated activations against transformers' own modules.

The torch paths are the references: they must equal transformers' operations bit for bit
(fp32 and bf16); the native CPU kernels must match the torch paths within rounding.
"""

from __future__ import annotations

import pytest
import torch
from transformers.activations import ACT2FN
from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm
from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
from transformers.models.gpt_oss.configuration_gpt_oss import GptOssConfig
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

from octavo.model_executor.layers.activation import (
    ClampedSwigluAndMul,
    GeluAndMul,
    GeluTanhAndMul,
    SiluAndMul,
    activation_for,
)
from octavo.model_executor.layers.layernorm import GemmaRMSNorm

DTYPES = [torch.float32, torch.bfloat16]
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 2e-2}


def close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    tolerance = TOLERANCE[dtype]
    torch.testing.assert_close(actual.float(), expected.float(), atol=tolerance, rtol=tolerance)


def gemma_norms(hidden: int, dtype: torch.dtype) -> tuple[GemmaRMSNorm, torch.nn.Module]:
    ours = GemmaRMSNorm(hidden, eps=1e-6).to(dtype)
    ours.weight.copy_(torch.randn(hidden) * 0.3)
    theirs = Gemma3RMSNorm(hidden, eps=1e-6).to(dtype)
    theirs.weight.data.copy_(ours.weight)
    return ours, theirs


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hf_norm", [Gemma2RMSNorm, Gemma3RMSNorm])
def test_gemma_rms_norm_torch_path_equals_transformers(dtype, hf_norm):
    hidden = 96
    ours = GemmaRMSNorm(hidden, eps=1e-6).to(dtype)
    ours.weight.copy_(torch.randn(hidden) * 0.3)
    theirs = hf_norm(hidden, eps=1e-6).to(dtype)
    theirs.weight.data.copy_(ours.weight)
    x = torch.randn(2, 5, hidden, dtype=dtype) * 3  # leading dims, as q/k norms per head
    with torch.no_grad():
        assert torch.equal(ours.forward_native(x), theirs(x))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemma_rms_norm_residual_fusion(dtype):
    ours, theirs = gemma_norms(64, dtype)
    x, residual = torch.randn(7, 64, dtype=dtype), torch.randn(7, 64, dtype=dtype)
    summed = residual + x  # Gemma's decoder layer adds in the model dtype
    with torch.no_grad():
        out, new_residual = ours.forward_native(x.clone(), residual.clone())
        assert torch.equal(new_residual, summed)
        assert torch.equal(out, theirs(summed))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,hidden", [(1, 576), (9, 64), (33, 1000)])
def test_gemma_rms_norm_forward_matches_transformers(ops, dtype, tokens, hidden):
    """forward (the native kernel in fp32, the torch path in bf16) against transformers."""
    ours, theirs = gemma_norms(hidden, dtype)
    x, residual = torch.randn(tokens, hidden, dtype=dtype), torch.randn(tokens, hidden, dtype=dtype)
    with torch.no_grad():
        expected = theirs(x)
        expected_fused = theirs(residual + x)
        close(ours(x.clone()), expected, dtype)
        out, new_residual = ours(x.clone(), residual.clone())
    close(out, expected_fused, dtype)
    assert torch.equal(new_residual, residual + x)
    if dtype == torch.bfloat16:  # the torch path: HF's operations exactly
        assert torch.equal(out, expected_fused)


def test_gemma_rms_norm_zero_weight_is_identity_scale():
    """A freshly made Gemma norm (weight 0) scales by 1, as transformers' does."""
    norm = GemmaRMSNorm(32)
    x = torch.randn(4, 32)
    expected = x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
    close(norm.forward_native(x), expected, torch.float32)


def gpt_oss_experts() -> GptOssExperts:
    config = GptOssConfig(
        hidden_size=8, intermediate_size=16, num_local_experts=2, swiglu_limit=7.0
    )
    return GptOssExperts(config)


@pytest.mark.parametrize("dtype", DTYPES)
def test_clamped_swiglu_equals_gpt_oss(dtype):
    """transformers applies it to the interleaved checkpoint layout; ours takes the halves."""
    experts = gpt_oss_experts()
    interleaved = torch.randn(11, 32, dtype=dtype) * 6  # beyond the limit on both sides
    halves = torch.cat([interleaved[:, ::2], interleaved[:, 1::2]], dim=-1)
    ours = ClampedSwigluAndMul(alpha=experts.alpha, limit=experts.limit)
    assert torch.equal(ours(halves), experts._apply_gate(interleaved))
    assert (interleaved.abs() > 7).any()


def test_clamped_swiglu_clamps():
    gate = torch.tensor([[100.0, -3.0]])
    up = torch.tensor([[100.0, -100.0]])
    out = ClampedSwigluAndMul(alpha=1.702, limit=7.0)(torch.cat([gate, up], dim=-1))
    expected_first = 8.0 * 7.0 * torch.sigmoid(torch.tensor(1.702 * 7.0))
    expected_second = -6.0 * -3.0 * torch.sigmoid(torch.tensor(1.702 * -3.0))
    torch.testing.assert_close(out, torch.stack([expected_first, expected_second])[None])


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_tanh_torch_path_equals_transformers(dtype):
    torch.manual_seed(0)  # gelu_new's bf16 rounding is past the tolerance for a rare input
    x = torch.randn(6, 2 * 40, dtype=dtype) * 4
    gate, up = x.chunk(2, dim=-1)
    assert torch.equal(GeluTanhAndMul.forward_native(x), ACT2FN["gelu_pytorch_tanh"](gate) * up)
    close(GeluTanhAndMul.forward_native(x), ACT2FN["gelu_new"](gate) * up, dtype)
    assert torch.equal(GeluAndMul()(x), ACT2FN["gelu"](gate) * up)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,size", [(1, 64), (5, 1000), (40, 17)])
def test_gelu_tanh_native_matches_torch(ops, dtype, tokens, size):
    wide = torch.randn(tokens, 2 * size + 8, dtype=dtype) * 4
    x = wide[:, : 2 * size]  # strided rows
    close(GeluTanhAndMul()(x), GeluTanhAndMul.forward_native(x), dtype)
    out = torch.empty(tokens, size, dtype=dtype)
    ops.gelu_tanh_and_mul(out, x.contiguous())
    close(out, GeluTanhAndMul.forward_native(x), dtype)


def test_gelu_tanh_extremes(ops):
    gate = torch.tensor([[-200.0, -10.0, -1e-3, 0.0, 1e-3, 10.0, 200.0]])
    x = torch.cat([gate, torch.ones_like(gate)], dim=-1)
    native = GeluTanhAndMul()(x)
    assert torch.isfinite(native).all()
    close(native, GeluTanhAndMul.forward_native(x), torch.float32)


@pytest.mark.parametrize(
    "name,module",
    [
        ("silu", SiluAndMul),
        ("swish", SiluAndMul),
        ("gelu_pytorch_tanh", GeluTanhAndMul),
        ("gelu_new", GeluTanhAndMul),
        ("gelu_fast", GeluTanhAndMul),
        ("gelu", GeluAndMul),
    ],
)
def test_activation_for_hf_names(name, module):
    activation = activation_for(name)
    assert isinstance(activation, module)
    x = torch.randn(3, 2 * 24)
    gate, up = x.chunk(2, dim=-1)
    close(activation(x), ACT2FN[name](gate) * up, torch.float32)


def test_activation_for_unknown_name_is_a_clear_error():
    with pytest.raises(ValueError, match=r"unsupported hidden_act 'relu2'.*silu"):
        activation_for("relu2")
