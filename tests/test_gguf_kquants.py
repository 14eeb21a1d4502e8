"""GGUF K-quants (Q4_K, Q5_K, Q6_K) and 5-bit blocks (Q5_0, Q5_1) kept quantized.

Dequantization (torch and native) is bit-equal to ``gguf.quants.dequantize`` on random
valid blocks; the native decode kernel equals an exact emulation of its scheme
(activations quantized to int8 per 32 columns, llama.cpp's); a tiny Llama written as a
GGUF mixing every kept kind (as ``Q4_K_M`` files mix Q4_K and Q6_K) serves through
``LLM(file.gguf)`` with HF's greedy tokens on the dequantized weights.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as GGML

from gguf_kquants import quantize, random_blocks, write_llama_gguf
from octavo.kernels import cpu_build
from octavo.kernels.cpu_build import cpu_ops
from octavo.model_executor.embedded import gguf_path
from octavo.model_executor.gguf_checkpoint import check_gguf_kinds
from octavo.model_executor.layers.quantization.blocks import (
    BlockKind,
    blocks_linear,
    dequantize,
)
from octavo.model_executor.layers.quantization.quantized_tensor import QuantizedTensor
from quantized_references import (
    forced_torch_path,
    greedy_runs,
    hf_float32,
    largest_logprob_gap,
    reference_greedy,
)

from tiny_models import build_tiny_model

NEW_KINDS = [GGML.Q5_0, GGML.Q5_1, GGML.Q4_K, GGML.Q5_K, GGML.Q6_K]
ROWS, COLS = 12, 768  # three K-quant super-blocks per row, 24 blocks of 32


def bits(values) -> np.ndarray:
    """float32 values as their bit patterns (a zero's sign counts)."""
    return np.ascontiguousarray(np.asarray(values, dtype=np.float32)).view(np.uint32)


def native_ops():
    ops = cpu_ops()
    assert ops is not None, "the native kernels must build here"
    return ops


@pytest.mark.parametrize("kind", NEW_KINDS, ids=lambda kind: kind.name)
def test_torch_dequantization_is_bit_equal_to_gguf(kind):
    blocks = random_blocks(kind, ROWS, COLS, np.random.default_rng(int(kind)))
    expected = gguf.quants.dequantize(blocks, kind)
    actual = dequantize(torch.from_numpy(blocks), BlockKind(int(kind)))
    assert actual.shape == (ROWS, COLS)
    assert np.array_equal(bits(actual), bits(expected))


@pytest.mark.parametrize("kind", [GGML.Q5_0, GGML.Q5_1], ids=lambda kind: kind.name)
def test_blocks_from_ggufs_own_quantizer_dequantize_bit_equal(kind):
    """Where the gguf package quantizes a kind itself, its blocks too."""
    weight = np.random.default_rng(5).standard_normal((ROWS, COLS)).astype(np.float32)
    blocks = gguf.quants.quantize(weight, kind)
    actual = dequantize(torch.from_numpy(blocks), BlockKind(int(kind)))
    assert np.array_equal(bits(actual), bits(gguf.quants.dequantize(blocks, kind)))


@pytest.mark.parametrize("kind", NEW_KINDS, ids=lambda kind: kind.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_native_dequantization_is_bit_equal_to_gguf(kind, dtype):
    blocks = random_blocks(kind, ROWS, COLS, np.random.default_rng(10 + int(kind)))
    out = torch.empty(ROWS, COLS, dtype=dtype)
    native_ops().dequantize_blocks(out, torch.from_numpy(blocks), int(kind), None)
    expected = torch.from_numpy(gguf.quants.dequantize(blocks, kind))
    assert np.array_equal(bits(out.float()), bits(expected.to(dtype).float()))


def emulated_native_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The native kernel's arithmetic, exactly: each activation row quantized to int8 per
    32 columns (scale amax / 127, round half to even), then multiplied in float64."""
    blocks = x.float().reshape(x.shape[0], -1, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    inverse = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    quantized = torch.round(blocks * inverse) * (amax / 127.0)
    return (quantized.reshape(x.shape[0], -1).double() @ weight.double().t()).float()


@pytest.mark.parametrize("kind", NEW_KINDS, ids=lambda kind: kind.name)
@pytest.mark.parametrize("rows", [1, 3, 4])
def test_native_linear_equals_the_emulated_scheme(kind, rows):
    """Decode rows: the integer kernel on the blocks vs the emulation on gguf's expansion."""
    generator = torch.Generator().manual_seed(rows)
    blocks = random_blocks(kind, ROWS, COLS, np.random.default_rng(20 + int(kind)))
    weight = torch.from_numpy(gguf.quants.dequantize(blocks, kind))
    x = torch.randn(rows, COLS, generator=generator)
    out = torch.empty(rows, ROWS)
    native_ops().quantized_linear(out, x, torch.from_numpy(blocks), int(kind), None)
    expected = emulated_native_linear(x, weight)
    assert (out - expected).abs().max() <= 1e-5 * expected.abs().max()


@pytest.mark.parametrize("kind", NEW_KINDS, ids=lambda kind: kind.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_block_linear_matches_the_dequantized_float_product(kind, dtype):
    """``blocks_linear`` end to end: native rows up to 16, dequantize + GEMM above."""
    weight = np.random.default_rng(3).standard_normal((ROWS, COLS)).astype(np.float32)
    blocks = torch.from_numpy(quantize(weight, kind))
    reference = dequantize(blocks, BlockKind(int(kind)))
    for rows in (1, 4, 9, 16, 17):
        x = torch.randn(rows, COLS, generator=torch.Generator().manual_seed(rows)).to(dtype)
        expected = x.float() @ reference.t()
        actual = blocks_linear(x, blocks, BlockKind(int(kind)))
        assert actual.dtype == dtype
        relative = (actual.float() - expected).norm() / expected.norm()
        assert relative < (0.02 if dtype == torch.float32 else 0.03), (rows, float(relative))


def test_a_k_quant_matrix_splits_only_at_super_block_edges():
    blocks = torch.from_numpy(random_blocks(GGML.Q4_K, 4, 512, np.random.default_rng(0)))
    matrix = QuantizedTensor(blocks, BlockKind.Q4_K, 512)
    second = matrix.narrow(1, 256, 256)
    assert torch.equal(second.dequantize(), matrix.dequantize()[:, 256:])
    with pytest.raises(ValueError, match="multiples of 256 columns"):
        matrix.narrow(1, 0, 128)


def test_an_unsupported_block_type_is_named_with_the_supported_ones(tmp_path):
    path = tmp_path / "q2k.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    raw = np.zeros((2, gguf.GGML_QUANT_SIZES[GGML.Q2_K][1]), dtype=np.uint8)
    writer.add_tensor("blk.0.attn_q.weight", raw, raw_dtype=GGML.Q2_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError) as error:
        check_gguf_kinds(path)
    message = str(error.value)
    assert "blk.0.attn_q.weight is Q2_K" in message
    assert "supported: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F32, F16, BF16" in message


# A Q4_K_M-like mix: Q4_K with Q6_K for V and down (the embedding Q8_0); the second
# layer takes every other kept kind, so a fused QKV holds three kinds side by side.
KINDS = {
    "token_embd.weight": GGML.Q8_0,  # the torch path expands the tied LM head every step
    "blk.0.attn_q.weight": GGML.Q4_K,
    "blk.0.attn_k.weight": GGML.Q4_K,
    "blk.0.attn_v.weight": GGML.Q6_K,
    "blk.0.attn_output.weight": GGML.Q4_K,
    "blk.0.ffn_gate.weight": GGML.Q4_K,
    "blk.0.ffn_up.weight": GGML.Q4_K,
    "blk.0.ffn_down.weight": GGML.Q6_K,
    "blk.1.attn_q.weight": GGML.Q5_K,
    "blk.1.attn_k.weight": GGML.Q5_0,
    "blk.1.attn_v.weight": GGML.Q8_0,
    "blk.1.attn_output.weight": GGML.Q5_1,
    "blk.1.ffn_gate.weight": GGML.Q4_0,
    "blk.1.ffn_up.weight": GGML.Q4_1,
    "blk.1.ffn_down.weight": GGML.Q5_K,
}
PROMPTS = ["Hello there", "The cat sat on", "def add(a, b):"]
TOKENS = 10
NATIVE_BOUND = 0.05  # nats, native integer kernels vs the fp32 reference


@pytest.fixture(scope="module")
def k_quant_model(tmp_path_factory, smol_tokenizer):
    """(the GGUF file, a float folder of its dequantized weights) of a tiny Llama whose
    every matrix is a multiple of 256 columns (K-quant blocks)."""
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("kquant")
    shape = {"hidden_size": 256, "intermediate_size": 512, "rope_scaling": None}
    source = build_tiny_model(root / "source", "llama3", smol_tokenizer, **shape)
    path = root / "tiny-q4_k_m.gguf"
    dequantized = write_llama_gguf(path, source, KINDS, gguf_path())
    reference = Path(shutil.copytree(source, root / "reference"))
    dequantized["lm_head.weight"] = dequantized["model.embed_tokens.weight"].clone()
    weights = {name: tensor.contiguous() for name, tensor in dequantized.items()}
    save_file(weights, str(reference / "model.safetensors"), metadata={"format": "pt"})
    return path, reference


def test_a_k_quant_gguf_is_token_identical_to_hf_on_the_torch_path(k_quant_model):
    path, reference = k_quant_model
    with forced_torch_path():
        runs = greedy_runs(path, PROMPTS, TOKENS)
    model = hf_float32(reference)
    assert [run.tokens for run in runs] == [
        reference_greedy(model, run.prompt_ids, TOKENS) for run in runs
    ]


def test_a_k_quant_gguf_serves_with_the_native_kernels(k_quant_model):
    path, reference = k_quant_model
    runs = greedy_runs(path, PROMPTS, TOKENS)
    assert largest_logprob_gap(hf_float32(reference), runs) < NATIVE_BOUND


@pytest.mark.skipif(
    os.environ.get(cpu_build.ISA_ENV) == "generic", reason="already the generic build"
)
def test_the_generic_build_passes_the_kernel_tests():
    """Machines without AVX2 run the scalar loops: this file's kernel tests against them."""
    env = {**os.environ, cpu_build.ISA_ENV: "generic"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__]
    command += ["-k", "native_dequantization or native_linear"]
    command += ["--rootdir", str(Path(__file__).parent)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert " passed" in result.stdout
    assert cpu_build.plan_build("generic").library.exists()
