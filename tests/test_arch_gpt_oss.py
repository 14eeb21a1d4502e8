"""gpt-oss: greedy fp32 token identity with transformers on a tiny random checkpoint it
writes here, and the same checkpoint in MXFP4 form (experts as ``_blocks`` / ``_scales``,
``quantization_config`` mxfp4, as the Hub's gpt-oss) loading to exactly the weights
transformers' own dequantization gives and, at tensor parallelism 2, greedy-identical to
transformers on those dequantized weights.

The checkpoint sets what differs from Llama to values that matter at this size: the first
layer slides a window of 24 tokens (shorter than the long prompts), the second attends
fully; every head has a sink (``self_attn.sinks``, random like every weight); rope is
yarn with an original context (64) below the prompts' positions; 4 experts, 2 per token,
with biases, and a SwiGLU limit (0.5) low enough that the clamps bite.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from architecture_check import (
    assert_matches_hf,
    check_prompts,
    hf_reference,
    octavo_greedy,
    write_tiny_checkpoint,
)
from octavo.kv_cache.cache_tensors import bytes_per_block
from octavo.model_executor.model_config import ModelConfig
from octavo.model_executor.models.registry import model_class
from octavo.model_executor.weights import load_weights

WINDOW = 24  # shorter than the long check prompts, so the sliding layer drops keys
GPT_OSS = {
    "max_position_embeddings": 256,  # yarn: 4 x the original 64 positions
    "sliding_window": WINDOW,
    "layer_types": ["sliding_attention", "full_attention"],
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "swiglu_limit": 0.5,  # gate/up values here have a std of ~0.4
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 150000.0,
        "factor": 4.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 64,
    },
}
EXPERT_MATRICES = ("gate_up_proj", "down_proj")  # [E, in, out] in the float checkpoint
FP4_CODES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])  # e2m1 magnitudes
GROUP = 32  # values sharing one e8m0 scale
POOL_BLOCKS = 11  # assert_matches_hf's one-rank KV pool, in blocks


@pytest.fixture(scope="module")
def gpt_oss_folder(tmp_path_factory, smol_tokenizer):
    folder = tmp_path_factory.mktemp("gpt_oss")
    return write_tiny_checkpoint(folder, "gpt_oss", smol_tokenizer, **GPT_OSS)


def test_gpt_oss_layers_are_built_as_the_config_says(gpt_oss_folder):
    config = ModelConfig.from_folder(gpt_oss_folder)
    model = model_class(config.architecture)(config)
    specs = [layer.spec.attention for layer in model.layers]
    assert [(spec.sliding_window, spec.sinks) for spec in specs] == [(WINDOW, True), (None, True)]
    assert all(spec.qkv_bias and spec.o_bias for spec in specs)
    assert model.rope_parameters()["full_attention"]["rope_type"] == "yarn"


def test_sinks_and_clamps_change_transformers_output(gpt_oss_folder, smol_tokenizer):
    """The identity checks below exercise the sinks and the SwiGLU clamps: without either,
    transformers' own greedy choices on the long prompt change."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(gpt_oss_folder, dtype=torch.float32).eval()
    ids = torch.tensor([check_prompts(smol_tokenizer)[1]])

    def choices() -> torch.Tensor:
        with torch.no_grad():
            return model(ids).logits.argmax(-1)

    reference = choices()
    for layer in model.model.layers:
        layer.mlp.experts.limit = math.inf
    assert not torch.equal(choices(), reference), "the SwiGLU clamps changed nothing"
    for layer in model.model.layers:
        layer.mlp.experts.limit = GPT_OSS["swiglu_limit"]
        layer.self_attn.sinks.data.fill_(-math.inf)
    assert not torch.equal(choices(), reference), "the attention sinks changed nothing"


def test_gpt_oss_matches_hf(gpt_oss_folder, smol_tokenizer):
    assert_matches_hf(gpt_oss_folder, smol_tokenizer)


def quantize_mxfp4(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of transformers' ``convert_moe_packed_tensors`` on one matrix stack:
    ``values [..., n]`` -> ``blocks [..., n / 32, 16]`` and ``scales [..., n / 32]`` (uint8).
    Each group of 32 gets the power of two that brings its peak to at most 6, and each
    value the nearest e2m1 code (low nibble first, sign in bit 3)."""
    groups = values.float().reshape(*values.shape[:-1], -1, GROUP)
    peak = groups.abs().amax(-1).clamp_min(2.0**-100)
    exponent = torch.ceil(torch.log2(peak / 6.0))
    scaled = groups / torch.exp2(exponent).unsqueeze(-1)
    codes = (scaled.abs().unsqueeze(-1) - FP4_CODES).abs().argmin(-1) + 8 * (scaled < 0)
    codes = codes.to(torch.uint8)
    return codes[..., 0::2] | (codes[..., 1::2] << 4), (exponent + 127).to(torch.uint8)


def copy_checkpoint(source: Path, target: Path, tensors: dict, quantization: dict | None) -> Path:
    """``source``'s folder with other tensors (and ``quantization_config`` where given)."""
    shutil.copytree(source, target)
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    if quantization is not None:
        config = json.loads((target / "config.json").read_text())
        config["quantization_config"] = quantization
        (target / "config.json").write_text(json.dumps(config))
    return target


@pytest.fixture(scope="module")
def mxfp4_folders(gpt_oss_folder, tmp_path_factory) -> tuple[Path, Path]:
    """(the experts as MXFP4 blocks and scales, the same dequantized by transformers)."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    packed, dequantized = {}, {}
    for name, tensor in load_file(str(gpt_oss_folder / "model.safetensors")).items():
        if not name.endswith(EXPERT_MATRICES):
            packed[name] = dequantized[name] = tensor
            continue
        blocks, scales = quantize_mxfp4(tensor.transpose(1, 2))  # groups run along inputs
        packed[f"{name}_blocks"], packed[f"{name}_scales"] = blocks, scales
        dequantized[name] = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
        assert dequantized[name].shape == tensor.shape
        assert not torch.equal(dequantized[name], tensor)  # the weights really changed
    root = tmp_path_factory.mktemp("gpt_oss_mxfp4")
    quantization = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}
    return (
        copy_checkpoint(gpt_oss_folder, root / "mxfp4", packed, quantization),
        copy_checkpoint(gpt_oss_folder, root / "dequantized", dequantized, None),
    )


def loaded_weights(folder: Path) -> dict[str, torch.Tensor]:
    config = ModelConfig.from_folder(folder)
    model = model_class(config.architecture)(config)
    load_weights(model, folder)
    return model.state_dict()


def test_mxfp4_checkpoint_loads_as_its_dequantized_weights(mxfp4_folders):
    """The experts read from blocks and scales equal transformers' dequantization, bit for
    bit (every other tensor is the same file's)."""
    mxfp4, dequantized = (loaded_weights(folder) for folder in mxfp4_folders)
    assert mxfp4.keys() == dequantized.keys()
    for name, tensor in mxfp4.items():
        assert torch.equal(tensor, dequantized[name]), name


def test_mxfp4_checkpoint_tensor_parallel_matches_hf_dequantized(mxfp4_folders, smol_tokenizer):
    """``quantization_config`` mxfp4 is not refused: the folder serves its experts kept 4-bit,
    over two ranks (2 of the 4 query heads and their sinks, 1 of the 2 KV heads, half of
    each expert's 96 intermediate rows: not whole 32-value groups of ``down_proj``),
    greedy-identical to transformers on the dequantized checkpoint. A rank's KV block
    holds half the heads, so half of the one-rank pool bytes keep its 11 blocks."""
    from octavo.model_executor.quantized_checkpoint import resolve_quantization

    mxfp4, dequantized = mxfp4_folders
    assert resolve_quantization(mxfp4, None) == "mxfp4"
    prompts = check_prompts(smol_tokenizer)
    expected = hf_reference(dequantized, prompts)
    block_bytes = bytes_per_block(ModelConfig.from_folder(mxfp4), 16, torch.float32)
    got, stats = octavo_greedy(
        mxfp4, prompts, tensor_parallel_size=2, kv_cache_memory=POOL_BLOCKS * block_bytes // 2
    )
    for index, (mine, theirs) in enumerate(zip(got, expected, strict=True)):
        assert mine == theirs, f"prompt {index}: octavo {mine} != transformers {theirs}"
    assert stats.num_preemptions > 0, "the KV pool was meant to force preemption"
    assert stats.prefix_cache_hits > 0, "the shared prefix was meant to hit the cache"
