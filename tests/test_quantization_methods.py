"""Quantized linears against float references: the block kernel (GGUF Q4_0/Q4_1/Q8_0,
GPTQ/AWQ's Q4_F32, int8 rows) native vs torch, fp8, every parallel layer with a
prequantized checkpoint matrix, and the errors a wrong method or file gets."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as GGML

from octavo.distributed import parallel_state
from octavo.distributed.parallel_state import TensorParallelGroup
from octavo.kernels.cpu_build import cpu_ops
from octavo.model_executor.gguf_checkpoint import check_gguf_kinds, hf_name
from octavo.model_executor.gptq_checkpoint import to_blocks
from octavo.model_executor.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from octavo.model_executor.layers.quantization.blocks import (
    BlockKind,
    blocks_linear,
    dequantize,
)
from octavo.model_executor.layers.quantization.fp8 import Fp8LinearMethod, quantize_fp8_per_row
from octavo.model_executor.layers.quantization.int8 import quantize_per_row
from octavo.model_executor.layers.quantization.prequantized import PrequantizedLinearMethod
from octavo.model_executor.layers.quantization.quantized_tensor import QuantizedTensor
from octavo.model_executor.layers.vocab import QuantizedVocabEmbedding
from octavo.model_executor.quantized_checkpoint import resolve_quantization

from int4_checkpoints import awq_tensors, gptq_tensors, quantize_groups

GGUF_KINDS = {BlockKind.Q4_0: GGML.Q4_0, BlockKind.Q4_1: GGML.Q4_1, BlockKind.Q8_0: GGML.Q8_0}
ROWS = [1, 3, 4, 5, 16, 17, 40]  # native kernel up to 16 rows, dequantize + GEMM above


def gguf_blocks(weight: torch.Tensor, kind: BlockKind) -> torch.Tensor:
    """llama.cpp's own quantizer (the gguf package) writes the blocks."""
    return torch.from_numpy(gguf.quants.quantize(weight.numpy(), GGUF_KINDS[kind]))


@pytest.mark.parametrize("kind", list(GGUF_KINDS))
def test_block_dequantization_matches_llama_cpps_reference(kind):
    blocks = gguf_blocks(torch.randn(48, 96), kind)
    expected = gguf.quants.dequantize(blocks.numpy(), GGUF_KINDS[kind])
    assert np.array_equal(dequantize(blocks, kind).numpy(), expected)


def reference_blocks(kind: BlockKind, generator: torch.Generator):
    """(blocks, row_scale, float weight they stand for) of one kind, 48 x 96."""
    weight = torch.randn(48, 96, generator=generator)
    if kind in GGUF_KINDS:
        blocks = gguf_blocks(weight, kind)
        return blocks, None, dequantize(blocks, kind)
    if kind == BlockKind.INT8_ROWS:
        quantized, scale = quantize_per_row(weight)
        return quantized.view(torch.uint8), scale, quantized.float() * scale[:, None]
    if kind == BlockKind.FP8_ROWS:
        quantized, scale = quantize_fp8_per_row(weight)
        return quantized.view(torch.uint8), scale, quantized.float() * scale[:, None]
    g_idx = torch.arange(96) // 32
    q, scale, zero, dequantized = quantize_groups(weight, g_idx)
    tensor = to_blocks("gptq", {"group_size": 32}, gptq_tensors(q, scale, zero, g_idx))
    return tensor.blocks, None, dequantized


# The kinds reference_blocks builds at 96 columns; GGUF's 5-bit and K-quant kinds (256-column
# blocks) have their own tests in test_gguf_kquants.py.
REFERENCE_KINDS = [*GGUF_KINDS, BlockKind.Q4_F32, BlockKind.INT8_ROWS, BlockKind.FP8_ROWS]
MULTIPLIED_KINDS = [k for k in REFERENCE_KINDS if k != BlockKind.FP8_ROWS]  # fp8: dequantized


@pytest.mark.parametrize("kind", MULTIPLIED_KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_block_linear_matches_the_dequantized_float_product(kind, dtype):
    """Native rows quantize activations per 32 (llama.cpp's Q8 scheme): ~1 % error."""
    assert cpu_ops() is not None, "the native kernels must build here"
    blocks, row_scale, weight = reference_blocks(kind, torch.Generator().manual_seed(int(kind)))
    for rows in ROWS:
        x = torch.randn(rows, 96).to(dtype)
        expected = x.float() @ weight.t()
        actual = blocks_linear(x, blocks, kind, row_scale)
        assert actual.dtype == dtype
        relative = (actual.float() - expected).norm() / expected.norm()
        assert relative < (0.02 if dtype == torch.float32 else 0.03), (rows, float(relative))


@pytest.mark.parametrize("kind", REFERENCE_KINDS)
def test_native_dequantization_equals_the_torch_path(kind):
    blocks, row_scale, _ = reference_blocks(kind, torch.Generator().manual_seed(1))
    out = torch.empty(48, 96)
    cpu_ops().dequantize_blocks(out, blocks, int(kind), row_scale)
    assert torch.equal(out, dequantize(blocks, kind, row_scale))


def test_gptq_and_awq_layouts_unpack_to_the_same_blocks():
    weight = torch.randn(64, 128)
    g_idx = torch.arange(128) // 32
    q, scale, zero, dequantized = quantize_groups(weight, g_idx)
    gptq = to_blocks("gptq", {"group_size": 32}, gptq_tensors(q, scale, zero, g_idx))
    awq = to_blocks("awq", {"group_size": 32}, awq_tensors(q, scale, zero))
    assert torch.equal(gptq.blocks, awq.blocks)
    assert torch.equal(gptq.dequantize(), dequantized)


def test_gptq_act_order_keeps_the_column_order():
    weight = torch.randn(64, 128)
    g_idx = (torch.arange(128) // 32)[
        torch.randperm(128, generator=torch.Generator().manual_seed(3))
    ]
    q, scale, zero, dequantized = quantize_groups(weight, g_idx)
    tensor = to_blocks(
        "gptq", {"group_size": 32, "desc_act": True}, gptq_tensors(q, scale, zero, g_idx)
    )
    assert tensor.column_order is not None
    assert torch.equal(tensor.dequantize(), dequantized)
    with pytest.raises(ValueError, match="act-order"):
        tensor.narrow(1, 0, 64)


LAYERS = {
    "column": lambda method: ColumnParallelLinear(96, 160, bias=True, method=method),
    "merged": lambda method: MergedColumnParallelLinear(96, [64, 64], method=method),
    "qkv": lambda method: QKVParallelLinear(96, 16, 6, 2, bias=True, method=method),
    "row": lambda method: RowParallelLinear(128, 96, bias=True, method=method),
}


def load_like_a_checkpoint(layer, weights: dict[str, torch.Tensor], quantize) -> None:
    """Feed each checkpoint matrix (quantized by ``quantize``) through the layer's loader."""
    for name, tensor in weights.items():
        module_param, _, shard = name.partition(":")
        target = getattr(layer, module_param)
        source = quantize(tensor) if module_param == "weight" else tensor
        if shard:
            layer.weight_loader(target, source, name, int(shard) if shard.isdigit() else shard)
        else:
            layer.weight_loader(target, source, name)


def checkpoint_matrices(kind: str, reference) -> dict[str, torch.Tensor]:
    weight = reference.weight.detach()
    if kind == "merged":
        return {"weight:0": weight[:64], "weight:1": weight[64:]}
    if kind == "qkv":
        q, k, v = weight.split([96, 32, 32])
        return {
            "weight:q": q,
            "weight:k": k,
            "weight:v": v,
            "bias:q": reference.bias[:96],
            "bias:k": reference.bias[96:128],
            "bias:v": reference.bias[128:],
        }
    matrices = {"weight": weight}
    bias = reference.reduced_bias if kind == "row" else reference.bias
    if bias is not None:
        matrices["reduced_bias" if kind == "row" else "bias"] = bias.detach()
    return matrices


@pytest.mark.parametrize("kind", sorted(LAYERS))
@pytest.mark.parametrize("block_kind", [BlockKind.Q4_1, BlockKind.Q8_0])
def test_each_parallel_layer_keeps_a_quantized_checkpoint(kind, block_kind):
    torch.manual_seed(0)
    reference = LAYERS[kind](None)
    for param in reference.parameters():
        param.data.normal_(0, 0.1)
    layer = LAYERS[kind](PrequantizedLinearMethod())
    with torch.no_grad():
        load_like_a_checkpoint(
            layer,
            checkpoint_matrices(kind, reference),
            lambda w: QuantizedTensor(gguf_blocks(w, block_kind), block_kind, w.shape[1]),
        )
        layer.process_weights_after_loading()
        reference.weight.copy_(
            dequantize(gguf_blocks(reference.weight.detach(), block_kind), block_kind)
        )
    assert len(layer.segments) == 1  # fused shards of one kind run as one matrix
    x = torch.randn(5, reference.input_size)
    expected, actual = reference(x), layer(x)
    relative = (actual - expected).norm() / expected.norm()
    assert relative < 0.02, float(relative)


def test_quantized_embedding_dequantizes_the_rows_it_reads():
    weight = torch.randn(64, 96)
    blocks = gguf_blocks(weight, BlockKind.Q8_0)
    embedding = QuantizedVocabEmbedding(64, 96)
    embedding.weight_loader(embedding.weight, QuantizedTensor(blocks, BlockKind.Q8_0, 96), "e")
    embedding.process_weights_after_loading()
    ids = torch.tensor([[3, 0], [63, 3]])
    expected = dequantize(blocks, BlockKind.Q8_0)[ids]
    assert torch.equal(embedding(ids), expected)
    assert embedding.embedding_blocks.data_ptr() == blocks.data_ptr()  # kept as loaded


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_layer_matches_its_float_reference(dtype):
    torch.manual_seed(0)
    reference, layer = LAYERS["qkv"](None), LAYERS["qkv"](Fp8LinearMethod())
    with torch.no_grad():
        for param in reference.parameters():
            param.normal_(0, 0.1)
        layer.load_state_dict(reference.state_dict())
    reference, layer = reference.to(dtype), layer.to(dtype)
    layer.process_weights_after_loading()
    x = torch.randn(7, 96, dtype=dtype)
    expected, actual = reference(x).float(), layer(x).float()
    assert layer.weight is None and layer.fp8_weight.dtype == torch.float8_e4m3fn
    assert (actual - expected).norm() / expected.norm() < 0.05


def test_fp8_quantization_is_within_e4m3_precision():
    values = torch.randn(32, 200) * torch.linspace(0.01, 10, 32).unsqueeze(1)
    quantized, scale = quantize_fp8_per_row(values)
    restored = quantized.float() * scale.unsqueeze(1)
    assert float(((restored - values).abs() / values.abs().clamp(min=1e-3)).median()) < 0.04


def test_gguf_names_map_to_hugging_face_names():
    assert hf_name("blk.7.attn_q.weight") == "model.layers.7.self_attn.q_proj.weight"
    assert hf_name("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj.weight"
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("rope_freqs.weight") is None


def test_an_unsupported_gguf_block_type_is_named(tmp_path):
    path = tmp_path / "k-quant.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    block_bytes = gguf.GGML_QUANT_SIZES[GGML.Q2_K][1]  # 256 weights per block
    blocks = np.zeros((8, block_bytes), dtype=np.uint8)
    writer.add_tensor("blk.0.attn_q.weight", blocks, raw_dtype=GGML.Q2_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match=r"blk\.0\.attn_q\.weight is Q2_K, a GGUF block type"):
        check_gguf_kinds(path)


def test_a_method_that_does_not_fit_the_checkpoint_is_refused(tmp_path, tiny_folder):
    folder = tiny_folder("llama3")
    with pytest.raises(ValueError, match="--quantization gptq needs a gptq checkpoint"):
        resolve_quantization(folder, "gptq")
    with pytest.raises(ValueError, match=r"--quantization gguf needs a \.gguf model"):
        resolve_quantization(folder, "gguf")
    assert resolve_quantization(folder, "int8") == "int8"


@pytest.fixture(autouse=True)
def one_rank():
    parallel_state.set_tensor_parallel_group(TensorParallelGroup())
