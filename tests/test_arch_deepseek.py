"""DeepSeek-V2 (V2-Lite-shaped) and DeepSeek-V3 (R1 / Kimi K2-shaped): tiny random
checkpoints written by transformers, greedy fp32 token-identical to HF ``generate`` with
chunked prefill (chunks cut the prompts), forced preemption and a prefix-cache hit
(``architecture_check``); the MLA cache's bytes per token from its formula.

Both have one dense layer, then MoE layers with a shared expert and 8 routed experts in 4
groups (2 kept per token). V2-Lite-shaped: a full-rank ``q_proj``, ``group_limited_greedy``
routing, ``routed_scaling_factor``, YaRN rope with DeepSeek's ``mscale`` /
``mscale_all_dim`` (the softmax scale too). V3-shaped: low-rank queries
(``q_a_proj``/``q_b_proj``), sigmoid routing with a nonzero ``e_score_correction_bias``,
``norm_topk_prob``, interleaved rope.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from architecture_check import (
    assert_matches_hf,
    check_prompts,
    hf_reference,
    write_tiny_checkpoint,
)
from octavo.kv_cache.cache_tensors import bytes_per_token
from octavo.model_executor.model_config import ModelConfig

MLA = {
    "num_hidden_layers": 3,
    "num_key_value_heads": 4,  # MLA: every head reads the one latent (transformers: heads)
    "max_position_embeddings": 512,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "head_dim": 8,  # transformers' rope tables are qk_rope_head_dim wide
    "v_head_dim": 16,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "first_k_dense_replace": 1,
    "n_group": 4,
    "topk_group": 2,
    "routed_scaling_factor": 1.5,
}
YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 128,
    "mscale": 1.0,
    "mscale_all_dim": 0.8,
    "beta_fast": 32,
    "beta_slow": 1,
}
CONFIGS = {
    "deepseek_v2": {
        **MLA,
        "q_lora_rank": None,
        "topk_method": "group_limited_greedy",
        "rope_parameters": YARN,
    },
    "deepseek_v3": {**MLA, "q_lora_rank": 24, "norm_topk_prob": True, "rope_interleave": True},
}


def add_correction_bias(folder: Path) -> None:
    """transformers draws no e_score_correction_bias (a buffer): give it values that change
    the experts chosen, so the test sees the bias used for the choice and not the weights."""
    file = folder / "model.safetensors"
    tensors = load_file(file)
    generator = torch.Generator().manual_seed(7)
    for name, tensor in tensors.items():
        if name.endswith("e_score_correction_bias"):
            tensors[name] = torch.randn(tensor.shape, generator=generator) * 0.5
    save_file(tensors, file, metadata={"format": "pt"})


@pytest.fixture(scope="module")
def folders(tmp_path_factory, smol_tokenizer) -> dict[str, Path]:
    made = {}
    for model_type, config in CONFIGS.items():
        target = tmp_path_factory.mktemp(model_type)
        made[model_type] = write_tiny_checkpoint(target, model_type, smol_tokenizer, **config)
    add_correction_bias(made["deepseek_v3"])
    return made


@pytest.mark.parametrize("model_type", list(CONFIGS))
def test_greedy_matches_hf(folders, smol_tokenizer, model_type):
    folder = folders[model_type]
    expected = hf_reference(folder, check_prompts(smol_tokenizer))
    assert_matches_hf(folder, smol_tokenizer, expected)


@pytest.mark.parametrize("model_type", list(CONFIGS))
def test_kv_bytes_per_token_is_the_latent(folders, model_type):
    """One latent of ``kv_lora_rank + qk_rope_head_dim`` values per token and layer, not keys
    and values per head: here 40 values against a 4-head GQA's 2 x 2 x 16 = 64 (and
    DeepSeek-V3's 576 against 2 x 128 x 128 = 32768 per layer)."""
    config = ModelConfig.from_folder(folders[model_type])
    latent = MLA["kv_lora_rank"] + MLA["qk_rope_head_dim"]
    assert config.kv_latent_dim == latent
    assert bytes_per_token(config, torch.float32) == MLA["num_hidden_layers"] * latent * 4
    assert bytes_per_token(config, torch.bfloat16) == MLA["num_hidden_layers"] * latent * 2
