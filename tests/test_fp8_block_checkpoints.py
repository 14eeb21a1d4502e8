"""FP8 block-quantized checkpoints (DeepSeek-V3/R1's format): a tiny random DeepSeek-V3
checkpoint, quantized here tile by tile into e4m3 weights and fp32 ``weight_scale_inv``,
served kept in FP8 and greedy fp32 token-identical to HF ``generate`` on the same weights
dequantized, with chunked prefill, forced preemption and a prefix-cache hit.

The tiles are 16 x 32 (``weight_block_size``; the releases' 128 x 128 is read the same
way), so most matrices have several tiles and some partial ones (``q_lora_rank`` 24, the
latent 40). Quantized: every projection of attention (MLA's ``q_a``/``q_b``/``kv_a``/
``kv_b``/``o``), the dense MLP, the shared expert and each routed expert; left float: the
router, norms, embeddings, the LM head and one module named in ``modules_to_not_convert``.
The engine keeps one byte per quantized weight plus the scales; ``kv_b_proj`` alone is
dequantized at load (the absorbed decode reads its per-head blocks as floats).
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from architecture_check import assert_matches_hf, check_prompts, hf_reference, write_tiny_checkpoint
from expert_names import QWEN_MOE
from moe_checkpoints import load_whole_checkpoint
from octavo.distributed.parallel_state import TensorParallelGroup
from octavo.model_executor.layers.moe import FusedMoE
from octavo.model_executor.layers.quantization.fp8_blocks import (
    NATIVE_MIN_VALUES,
    Fp8BlockTensor,
)
from octavo.model_executor.loader import weight_bytes
from octavo.model_executor.quantized_checkpoint import resolve_quantization
from test_arch_deepseek import CONFIGS, add_correction_bias
from test_parallel_layers import on_ranks

BLOCK = (16, 32)  # rows (output features) x columns (input features) of one tile
FP8 = torch.float8_e4m3fn
NOT_CONVERTED = "model.layers.0.mlp.down_proj"  # the dense layer's down projection
DEQUANTIZED_AT_LOAD = "kv_b_proj"


def quantize_blocks(values: torch.Tensor, block=BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """``(e4m3 weights, fp32 scale_inv per tile)``: each tile's peak maps to e4m3's 448."""
    rows, cols = values.shape
    tiles = (-(-rows // block[0]), -(-cols // block[1]))
    padded = values.new_zeros(tiles[0] * block[0], tiles[1] * block[1])
    padded[:rows, :cols] = values
    grid = padded.view(tiles[0], block[0], tiles[1], block[1])
    scale = grid.abs().amax(dim=(1, 3)).clamp(min=1e-12) / torch.finfo(FP8).max
    codes = (grid / scale[:, None, :, None]).to(FP8).view(padded.shape)[:rows, :cols]
    return codes.contiguous(), scale


def dequantize_blocks(codes: torch.Tensor, scale: torch.Tensor, block=BLOCK) -> torch.Tensor:
    """The reference weights: each code times its tile's scale, in fp32."""
    rows, cols = codes.shape
    per_value = scale.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)
    return codes.float() * per_value[:rows, :cols]


def is_quantized(name: str) -> bool:
    """The linears DeepSeek's FP8 releases store in FP8 (routers, norms, embeddings and the
    LM head stay float)."""
    linear = name.endswith("_proj.weight") or name.endswith("_mqa.weight")
    return linear and not name.startswith(NOT_CONVERTED)


@pytest.fixture(scope="module")
def folders(tmp_path_factory, smol_tokenizer) -> tuple[Path, Path]:
    """(the FP8 checkpoint, the same weights dequantized as HF's reference)."""
    source = tmp_path_factory.mktemp("deepseek_v3")
    write_tiny_checkpoint(source, "deepseek_v3", smol_tokenizer, **CONFIGS["deepseek_v3"])
    add_correction_bias(source)
    fp8, dequantized = {}, {}
    for name, tensor in load_file(source / "model.safetensors").items():
        if not is_quantized(name):
            fp8[name] = dequantized[name] = tensor
            continue
        codes, scale = quantize_blocks(tensor)
        fp8[name], fp8[name.removesuffix("weight") + "weight_scale_inv"] = codes, scale
        dequantized[name] = dequantize_blocks(codes, scale)
    settings = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic"}
    settings.update(weight_block_size=list(BLOCK), modules_to_not_convert=[NOT_CONVERTED])
    root = tmp_path_factory.mktemp("fp8_blocks")
    return (
        copy_checkpoint(source, root / "fp8", fp8, settings),
        copy_checkpoint(source, root / "dequantized", dequantized, None),
    )


def copy_checkpoint(source: Path, target: Path, tensors: dict, settings: dict | None) -> Path:
    shutil.copytree(source, target)
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    if settings is not None:
        config = json.loads((target / "config.json").read_text())
        config["quantization_config"] = settings
        (target / "config.json").write_text(json.dumps(config))
    return target


def expected_weight_bytes(folder: Path) -> tuple[int, int]:
    """(bytes the engine should hold, quantized weights among them): one byte per FP8
    weight and four per scale; float tensors, and ``kv_b_proj`` widened, four per value."""
    tensors = load_file(folder / "model.safetensors")
    total = quantized = 0
    for name, tensor in tensors.items():
        if name.endswith("weight_scale_inv") and DEQUANTIZED_AT_LOAD in name:
            continue
        if tensor.dtype == FP8 and DEQUANTIZED_AT_LOAD not in name:
            quantized += tensor.numel()
            total += tensor.numel()
        else:
            total += tensor.numel() * 4
    return total, quantized


def test_fp8_block_checkpoint_matches_hf_on_its_dequantized_weights(folders, smol_tokenizer):
    """Greedy identity (chunked prefill, preemption, prefix-cache hit) and the weights'
    bytes in the engine: FP8 kept, not widened."""
    fp8, dequantized = folders
    assert resolve_quantization(fp8, None) == "fp8_block"
    expected = hf_reference(dequantized, check_prompts(smol_tokenizer))
    total, quantized = expected_weight_bytes(fp8)

    def check_bytes(llm) -> None:
        model = llm.engine.executor.worker.model
        assert weight_bytes(model) == total
        layer = model.layers[1].self_attn.q_b_proj
        assert [type(segment.weight) for segment in layer.segments] == [Fp8BlockTensor]
        assert model.layers[1].self_attn.kv_b_proj.weight.dtype == torch.float32

    assert quantized > 150_000  # every expert, shared expert and projection but two
    assert_matches_hf(fp8, smol_tokenizer, expected, check_bytes)


def test_a_slice_at_any_row_or_column_equals_the_dequantized_matrix():
    """Tensor-parallel and fused-shard slices start inside tiles: 128 x 128 tiles over a
    300 x 300 matrix (partial tiles both ways), cut at rows 37.. and columns 150.."""
    values = torch.randn(300, 300, generator=torch.Generator().manual_seed(0))
    codes, scale = quantize_blocks(values, (128, 128))
    matrix = Fp8BlockTensor(codes, scale, (128, 128))
    reference = dequantize_blocks(codes, scale, (128, 128))
    assert torch.equal(matrix.dequantize(), reference)
    part = matrix.narrow(0, 37, 120).narrow(1, 150, 100).narrow(0, 100, 20)
    assert torch.equal(part.dequantize(), reference[137:157, 150:250])
    large = matrix.narrow(1, 0, 256)  # whole 32-column blocks, 76,800 values: widened natively
    assert large.shape[0] * large.shape[1] >= NATIVE_MIN_VALUES
    assert torch.equal(large.dequantize(), reference[:, :256])
    x = torch.randn(3, 100)
    assert torch.equal(part.apply(x), torch.nn.functional.linear(x, reference[137:157, 150:250]))


def test_fp8_checkpoints_it_cannot_read_are_refused(folders, tmp_path):
    fp8, _ = folders
    assert resolve_quantization(fp8, "fp8") == "fp8_block"  # vLLM's flag for it
    with pytest.raises(ValueError, match="already quantized with fp8_block"):
        resolve_quantization(fp8, "int8")
    per_tensor = tmp_path / "per_tensor"
    per_tensor.mkdir()
    config = json.loads((fp8 / "config.json").read_text())
    del config["quantization_config"]["weight_block_size"]
    (per_tensor / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="without weight_block_size"):
        resolve_quantization(per_tensor, None)


@pytest.mark.parametrize("expert_parallel", [False, True])
def test_fp8_experts_on_two_ranks_equal_the_float_experts(monkeypatch, expert_parallel):
    """A DeepSeek MoE block over two ranks (the all-reduce a sum here), 16 x 16 tiles and 24
    intermediate rows per expert: a tensor-parallel rank's 12 gate/up rows and down columns
    start inside a tile. FP8 experts give the float experts' output on the same weights."""
    generator = torch.Generator().manual_seed(3)
    fp8 = {"gate.weight": torch.randn(4, 32, generator=generator)}
    dense = dict(fp8)
    for expert in range(4):
        for part, shape in (("gate", (24, 32)), ("up", (24, 32)), ("down", (32, 24))):
            name = f"experts.{expert}.{part}_proj.weight"
            codes, scale = quantize_blocks(torch.randn(shape, generator=generator), (16, 16))
            fp8[name] = Fp8BlockTensor(codes, scale, (16, 16))
            dense[name] = dequantize_blocks(codes, scale, (16, 16))
    monkeypatch.setattr(TensorParallelGroup, "all_reduce", lambda self, tensor: tensor)
    hidden = torch.randn(9, 32, generator=generator)
    outputs = []
    for checkpoint, quantization in ((dense, None), (fp8, "fp8_block")):
        build = functools.partial(moe_block, checkpoint, quantization, expert_parallel)
        with torch.no_grad():
            outputs.append(sum(rank(hidden) for rank in on_ranks(2, build)))
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-6, atol=1e-6)


def moe_block(checkpoint: dict, quantization, expert_parallel: bool) -> FusedMoE:
    moe = FusedMoE(
        4,
        2,
        32,
        24,
        names=QWEN_MOE,
        quantization=quantization,
        enable_expert_parallel=expert_parallel,
    )
    load_whole_checkpoint(moe, checkpoint)
    moe.process_weights_after_loading()
    return moe
