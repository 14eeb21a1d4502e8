"""gpt-oss's MXFP4 experts kept 4-bit (``quantization`` ``mxfp4``): a tiny random gpt-oss
checkpoint whose experts this test writes as ``_blocks`` / ``_scales`` (as the Hub's
gpt-oss), served greedy fp32 token-identical to HF ``generate`` on the same experts
dequantized by transformers, with chunked prefill, forced preemption and a prefix-cache
hit; in the engine the experts take 17 bytes per 32 weights (16 bytes of e2m1 codes and
one e8m0 scale) and nothing of them is widened to float. (Two tensor-parallel ranks, a
``down_proj`` split inside a 32-value group, run in ``test_arch_gpt_oss``.)
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from architecture_check import assert_matches_hf, check_prompts, hf_reference, write_tiny_checkpoint
from expert_names import GPT_OSS
from moe_checkpoints import load_whole_checkpoint
from octavo.distributed.parallel_state import TensorParallelGroup
from octavo.model_executor.layers.activation import ClampedSwigluAndMul
from octavo.model_executor.layers.moe import FusedMoE
from octavo.model_executor.layers.moe.mxfp4_experts import Mxfp4Tensor
from octavo.model_executor.layers.moe.quantized_experts import experts_sync_with_host
from octavo.model_executor.loader import weight_bytes
from octavo.model_executor.quantized_checkpoint import resolve_quantization
from test_arch_gpt_oss import EXPERT_MATRICES, copy_checkpoint, quantize_mxfp4
from test_arch_gpt_oss import GPT_OSS as GPT_OSS_CONFIG
from test_parallel_layers import on_ranks

MXFP4 = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}


@pytest.fixture(scope="module")
def folders(tmp_path_factory, smol_tokenizer) -> tuple[Path, Path]:
    """(the experts as MXFP4 blocks and scales, the same dequantized by transformers)."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    source = tmp_path_factory.mktemp("gpt_oss")
    write_tiny_checkpoint(source, "gpt_oss", smol_tokenizer, **GPT_OSS_CONFIG)
    packed, dequantized = {}, {}
    for name, tensor in load_file(str(source / "model.safetensors")).items():
        if not name.endswith(EXPERT_MATRICES):
            packed[name] = dequantized[name] = tensor
            continue
        blocks, scales = quantize_mxfp4(tensor.transpose(1, 2))  # groups run along inputs
        packed[f"{name}_blocks"], packed[f"{name}_scales"] = blocks, scales
        dequantized[name] = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    root = tmp_path_factory.mktemp("mxfp4_kept")
    return (
        copy_checkpoint(source, root / "mxfp4", packed, MXFP4),
        copy_checkpoint(source, root / "dequantized", dequantized, None),
    )


def checkpoint_bytes(folder: Path) -> tuple[int, int, int]:
    """(bytes the engine should hold, MXFP4 bytes among them, expert weights they hold):
    the blocks and scales as stored, every float tensor in fp32."""
    total = packed = weights = 0
    for name, tensor in load_file(str(folder / "model.safetensors")).items():
        if tensor.dtype == torch.uint8:
            packed += tensor.numel()
            weights += tensor.numel() * 2 if name.endswith("_blocks") else 0
        else:
            total += tensor.numel() * 4
    return total + packed, packed, weights


def expert_bytes(moe: FusedMoE) -> int:
    return sum(b.numel() * b.element_size() for b in moe.quantized.buffers())


def test_mxfp4_experts_kept_4_bit_match_hf_on_their_dequantized_form(folders, smol_tokenizer):
    mxfp4, dequantized = folders
    assert resolve_quantization(mxfp4, None) == "mxfp4"
    expected = hf_reference(dequantized, check_prompts(smol_tokenizer))
    total, packed, weights = checkpoint_bytes(mxfp4)
    assert packed * 32 == weights * 17  # 4.25 bits a weight

    def check_bytes(llm) -> None:
        model = llm.engine.executor.worker.model
        assert weight_bytes(model) == total
        moes = [layer.mlp for layer in model.layers]
        assert all(moe.w13 is None and moe.w2 is None for moe in moes)  # no float stacks
        assert sum(expert_bytes(moe) for moe in moes) == packed
        linear = moes[0].quantized.gate_up[0]
        assert [type(segment.weight) for segment in linear.segments] == [Mxfp4Tensor]
        assert experts_sync_with_host(model)  # no decode CUDA graphs over the grouped path

    assert_matches_hf(mxfp4, smol_tokenizer, expected, check_bytes)


def test_a_column_slice_inside_a_group_equals_the_dequantized_columns():
    """A rank's ``down_proj`` columns may start and end inside 32-value groups; the rows of
    ``gate_up_proj`` are cut anywhere. Values as transformers dequantizes them."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    generator = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (1, 10, 4, 16), dtype=torch.uint8, generator=generator)
    scales = torch.randint(120, 130, (1, 10, 4), dtype=torch.uint8, generator=generator)
    reference = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)[0].T  # [10, 128]
    matrix = Mxfp4Tensor(blocks[0], scales[0])
    assert matrix.shape == (10, 128) and torch.equal(matrix.dequantize(), reference)
    part = matrix.narrow(1, 40, 70).narrow(0, 3, 5).narrow(1, 10, 30)
    assert part.shape == (5, 30) and part.scales.shape == (5, 2)  # two groups touched
    assert torch.equal(part.dequantize(torch.bfloat16), reference[3:8, 50:80].bfloat16())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dequantization_equals_transformers_over_every_scale_byte(dtype):
    """Every e8m0 byte (2^-127 .. 2^128, subnormal and overflowing results included) gives
    transformers' ``ldexp`` values bit for bit (NaN where it gives NaN)."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    generator = torch.Generator().manual_seed(1)
    blocks = torch.randint(0, 256, (2, 256, 2, 16), dtype=torch.uint8, generator=generator)
    scales = torch.arange(256, dtype=torch.uint8).repeat(2, 2, 1).transpose(1, 2).contiguous()
    expected = convert_moe_packed_tensors(blocks, scales, dtype=dtype)
    got = Mxfp4Tensor(blocks[1], scales[1]).dequantize(dtype)
    assert torch.equal(got.nan_to_num(), expected[1].T.nan_to_num())
    assert torch.equal(got.isnan(), expected[1].T.isnan())


@pytest.mark.parametrize("inter", [64, 96])  # a rank's 48 down columns: ends inside a group
@pytest.mark.parametrize("expert_parallel", [False, True])
def test_kept_experts_on_two_ranks_equal_the_float_experts(monkeypatch, inter, expert_parallel):
    """A gpt-oss MoE block over two ranks (tensor or expert parallel; the all-reduce a sum
    here): the experts kept 4-bit give the float experts' output from the same checkpoint
    dequantized."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    generator = torch.Generator().manual_seed(2)
    packed = {"router.weight": torch.randn(4, 32, generator=generator)}
    packed["router.bias"] = torch.randn(4, generator=generator)
    packed["experts.gate_up_proj_bias"] = torch.randn(4, 2 * inter, generator=generator)
    packed["experts.down_proj_bias"] = torch.randn(4, 32, generator=generator)
    dense = dict(packed)
    shapes = {"gate_up_proj": (2 * inter, 32), "down_proj": (32, inter)}  # [rows, inputs]
    for name, (rows, columns) in shapes.items():
        shape = (4, rows, columns // 32)
        blocks = torch.randint(0, 256, (*shape, 16), dtype=torch.uint8, generator=generator)
        scales = torch.randint(122, 128, shape, dtype=torch.uint8, generator=generator)
        packed[f"experts.{name}_blocks"], packed[f"experts.{name}_scales"] = blocks, scales
        dense[f"experts.{name}"] = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    monkeypatch.setattr(TensorParallelGroup, "all_reduce", lambda self, tensor: tensor)
    hidden = torch.randn(9, 32, generator=generator)
    outputs = []
    for checkpoint, quantization in ((dense, None), (packed, "mxfp4")):
        build = functools.partial(gpt_oss_moe, checkpoint, inter, quantization, expert_parallel)
        with torch.no_grad():
            outputs.append(sum(rank(hidden) for rank in on_ranks(2, build)))
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-6, atol=1e-6)


def gpt_oss_moe(checkpoint: dict, inter: int, quantization, expert_parallel: bool) -> FusedMoE:
    moe = FusedMoE(
        4,
        2,
        32,
        inter,
        names=GPT_OSS,
        router="softmax_after_topk",
        renormalize=False,
        activation=ClampedSwigluAndMul(),
        bias=True,
        router_bias=True,
        quantization=quantization,
        enable_expert_parallel=expert_parallel,
    )
    load_whole_checkpoint(moe, checkpoint)
    moe.process_weights_after_loading()
    return moe
