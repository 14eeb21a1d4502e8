"""Phi-3, Granite, OLMo 2 and SmolLM3: greedy fp32 token identity with transformers on tiny
random checkpoints transformers writes here, tensor parallelism for Phi-3 and OLMo 2, and
a PEFT adapter on Phi-3's fused ``qkv_proj`` / ``gate_up_proj`` equal to HF + PEFT.

Each checkpoint sets what differs from Llama to values that matter at this size:
Phi-3 stores Q/K/V and gate/up fused, slides a window of 24 tokens (shorter than the long
prompts) and rotates half of each head with LongRoPE (``original_max_position_embeddings``
above the prompts, so transformers also takes the short factors throughout, and the
attention factor of a 4x context applies); Granite's four multipliers are far from 1;
OLMo 2 norms after each block and over the whole Q/K projections; SmolLM3 skips rope in
its second layer, which also slides.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from architecture_check import assert_matches_hf, write_tiny_checkpoint
from octavo import LLM, LoRARequest, SamplingParams
from octavo.kv_cache.cache_tensors import bytes_per_block
from octavo.model_executor.model_config import ModelConfig
from octavo.model_executor.models.registry import model_class

from conftest import hf_greedy
from lora_adapters import hf_with_adapter, make_adapter

WINDOW = 24  # shorter than the long check prompts, so sliding layers drop keys
ROTARY_HALF = 4  # head_dim 16 * partial_rotary_factor 0.5 = 8 rotary dims: 4 frequencies
PHI3 = {
    "sliding_window": WINDOW,
    "original_max_position_embeddings": 256,
    "rope_parameters": {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
        "short_factor": [1.0, 1.5, 2.0, 4.0][:ROTARY_HALF],
        "long_factor": [2.0, 4.0, 8.0, 16.0][:ROTARY_HALF],
    },
}
GRANITE = {
    "embedding_multiplier": 6.0,
    "residual_multiplier": 0.3,
    "attention_multiplier": 0.6,
    "logits_scaling": 4.0,
    "attention_bias": True,
}
SMOLLM3 = {
    "no_rope_layers": [1, 0],  # 1: the layer uses rope; the second layer has none
    "use_sliding_window": True,
    "sliding_window": WINDOW,  # transformers makes the NoPE layer the sliding one
    "pad_token_id": None,  # the default (128004) is outside the tiny vocabulary
}
# KV pools (blocks of one rank) that force preemption: architecture_check's 11 blocks, and
# 8 for Phi-3, whose every layer slides, so blocks behind the window are freed as it goes.
POOL_BLOCKS = {"phi3_folder": 8, "olmo2_folder": 11}
PHI3_LORA_TARGETS = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
LORA_TOKENS = 10
LORA_PROMPTS = ["Tell me about the moon.", "Please explain PagedAttention in detail. " * 4]


@pytest.fixture(scope="module")
def phi3_folder(tmp_path_factory, smol_tokenizer):
    folder = tmp_path_factory.mktemp("phi3")
    return write_tiny_checkpoint(folder, "phi3", smol_tokenizer, **PHI3)


@pytest.fixture(scope="module")
def olmo2_folder(tmp_path_factory, smol_tokenizer):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("olmo2"), "olmo2", smol_tokenizer)


def kv_pool(folder, blocks: int, ranks: int = 1) -> int:
    """Bytes of ``blocks`` KV blocks of one of ``ranks`` tensor-parallel ranks (each holds
    its share of the KV heads)."""
    config = ModelConfig.from_folder(folder)
    rank_kv = dataclasses.replace(config, num_kv_heads=config.num_kv_heads // ranks)
    return blocks * bytes_per_block(rank_kv, 16, torch.float32)


def test_phi3_matches_hf(phi3_folder, smol_tokenizer):
    pool = kv_pool(phi3_folder, POOL_BLOCKS["phi3_folder"])
    assert_matches_hf(phi3_folder, smol_tokenizer, kv_cache_memory=pool)


def test_granite_matches_hf(tmp_path, smol_tokenizer):
    folder = write_tiny_checkpoint(tmp_path, "granite", smol_tokenizer, **GRANITE)
    assert_matches_hf(folder, smol_tokenizer)


def test_olmo2_matches_hf(olmo2_folder, smol_tokenizer):
    assert_matches_hf(olmo2_folder, smol_tokenizer)


def test_smollm3_matches_hf(tmp_path, smol_tokenizer):
    folder = write_tiny_checkpoint(tmp_path, "smollm3", smol_tokenizer, **SMOLLM3)
    config = ModelConfig.from_folder(folder)
    specs = [model_class(config.architecture)(config).attention_spec(i) for i in range(2)]
    assert [(spec.rope, spec.sliding_window) for spec in specs] == [
        ("full_attention", None),
        (None, WINDOW),
    ]
    assert_matches_hf(folder, smol_tokenizer)


@pytest.mark.parametrize("fixture", ["phi3_folder", "olmo2_folder"])
def test_tensor_parallel_matches_hf(request, fixture, smol_tokenizer):
    """Two ranks, each with 2 of the 4 query heads and 1 of the 2 KV heads (OLMo 2's Q/K
    norm then sums its mean square over both ranks). A rank's KV block holds half the
    heads: the pool is sized in a rank's blocks so the run still preempts."""
    folder = request.getfixturevalue(fixture)
    pool = kv_pool(folder, POOL_BLOCKS[fixture], ranks=2)
    assert_matches_hf(folder, smol_tokenizer, tensor_parallel_size=2, kv_cache_memory=pool)


def test_phi3_stores_qkv_and_gate_up_fused(phi3_folder):
    """The checkpoint really is Phi-3's layout: the loader split fused tensors."""
    from safetensors import safe_open

    with safe_open(str(phi3_folder / "model.safetensors"), framework="pt") as tensors:
        names = set(tensors.keys())
    assert "model.layers.0.self_attn.qkv_proj.weight" in names
    assert "model.layers.0.mlp.gate_up_proj.weight" in names
    assert not any("q_proj" in name or "gate_proj" in name for name in names)


def test_phi3_fused_module_lora_matches_hf_peft(phi3_folder, smol_tokenizer, tmp_path):
    """A PEFT adapter on Phi-3's fused modules: its lora_B rows split into Q/K/V and
    gate/up, one batch mixing the base model and the adapter equal to HF (+ PEFT)."""
    adapter = make_adapter(phi3_folder, tmp_path / "adapter", seed=3, targets=PHI3_LORA_TARGETS)
    prompts = [smol_tokenizer.encode(text) for text in LORA_PROMPTS]
    expected = [
        [hf_greedy(model, ids, LORA_TOKENS, ignore_eos=True) for ids in prompts]
        for model in (hf_with_adapter(phi3_folder, None), hf_with_adapter(phi3_folder, adapter))
    ]
    assert expected[0] != expected[1], "the adapter was meant to change the output"
    params = SamplingParams(temperature=0.0, max_tokens=LORA_TOKENS, ignore_eos=True)
    request = LoRARequest("phi3-fused", 1, str(adapter))
    engine = {"dtype": "float32", "max_model_len": 128, "enable_lora": True, "max_lora_rank": 8}
    with LLM(str(phi3_folder), **engine) as llm:
        outputs = llm.generate(
            prompts * 2, params, use_tqdm=False, lora_request=[None, None, request, request]
        )
    got = [out.outputs[0].token_ids for out in outputs]
    assert [got[:2], got[2:]] == expected


def test_fused_lora_names_are_refused_where_the_model_has_none(tmp_path, smol_tokenizer):
    """``qkv_proj`` adapts nothing in a Llama: one clear error naming what can be adapted."""
    import json

    from octavo.lora.peft_adapter import load_peft_adapter

    folder = write_tiny_checkpoint(tmp_path / "llama", "llama", smol_tokenizer)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    settings = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["qkv_proj"]}
    (adapter / "adapter_config.json").write_text(json.dumps(settings))
    with pytest.raises(ValueError, match=r"target modules \['qkv_proj'\] are not in"):
        load_peft_adapter(str(adapter), ModelConfig.from_folder(folder), max_rank=8)
