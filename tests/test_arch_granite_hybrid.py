"""Granite 4.0 hybrid (``GraniteMoeHybridForCausalLM``): tiny random checkpoints written by
transformers, greedy fp32 token-identical to HF ``generate`` through ``LLM(folder)``: a
batch of prompts of different lengths, prefilled in chunks (the step budget cuts the long
ones, and the Mamba2 SSD blocks are shorter than the chunks), with forced preemption (a
KV pool smaller than the batch needs: preempted sequences recompute their state from
zero).

Two shapes: MoE (4 experts, top 2, beside the shared MLP) with NoPE attention, as the
released models, and Mamba2 heads in 2 groups; dense (``num_local_experts`` 0) with rope,
and one group as the released models. Both: two Mamba2 layers of 4 heads around one
attention layer, Granite's four multipliers.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from architecture_check import NEW_TOKENS, check_prompts, hf_reference, write_tiny_checkpoint
from octavo import LLM, SamplingParams
from octavo.kv_cache.cache_tensors import bytes_per_block
from octavo.model_executor.model_config import ModelConfig

from conftest import assert_all_blocks_free

HYBRID = {
    "num_hidden_layers": 3,
    "layer_types": ["mamba", "attention", "mamba"],
    "intermediate_size": 32,  # one expert's
    "shared_intermediate_size": 48,
    "mamba_n_heads": 4,
    "mamba_n_groups": 2,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_chunk_size": 16,
    "mamba_conv_bias": True,
    "embedding_multiplier": 2.0,
    "residual_multiplier": 0.5,
    "attention_multiplier": 0.2,
    "logits_scaling": 1.5,
}
CONFIGS = {
    "moe_nope": {**HYBRID, "num_local_experts": 4, "num_experts_per_tok": 2},
    "dense_rope": {
        **HYBRID,
        "num_local_experts": 0,
        "position_embedding_type": "rope",
        "mamba_n_groups": 1,  # as the released models
    },
}
MAX_NUM_SEQS = 4


def state_bytes_per_sequence(config: ModelConfig) -> int:
    """float32 conv and SSM states of every Mamba2 layer: what one slot holds."""
    hf = config.hf
    inner = hf.mamba_n_heads * hf.mamba_d_head
    conv = (inner + 2 * hf.mamba_n_groups * hf.mamba_d_state) * (hf.mamba_d_conv - 1)
    ssm = inner * hf.mamba_d_state
    mamba_layers = sum(1 for kind in config.layer_types if kind == "linear_attention")
    return 4 * mamba_layers * (conv + ssm)


@pytest.fixture(scope="module")
def folders(tmp_path_factory, smol_tokenizer) -> dict[str, Path]:
    return {
        name: write_tiny_checkpoint(
            tmp_path_factory.mktemp(name), "granitemoehybrid", smol_tokenizer, **config
        )
        for name, config in CONFIGS.items()
    }


def octavo_greedy(folder: Path, prompts: list[list[int]]) -> tuple[list[list[int]], object]:
    config = ModelConfig.from_folder(folder)
    attention_layers = sum(1 for kind in config.layer_types if kind == "full_attention")
    block = bytes_per_block(config, 16, torch.float32) * attention_layers // config.num_layers
    states = (MAX_NUM_SEQS + 1) * state_bytes_per_sequence(config)
    args = {
        "dtype": "float32",
        "max_model_len": 160,
        "max_num_batched_tokens": 48,
        "max_num_seqs": MAX_NUM_SEQS,
        "kv_cache_memory": states + 11 * block,  # 176 tokens of KV; the batch needs ~235
    }
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    with LLM(str(folder), **args) as llm:
        outputs = llm.generate(prompts, params, use_tqdm=False)
        stats = llm.engine.stats()
        assert_all_blocks_free(llm.engine)
        specs = llm.engine.executor.worker.state_specs
    slot_bytes = sum(spec.bytes_per_slot(torch.float32) for spec in specs if spec is not None)
    assert slot_bytes == state_bytes_per_sequence(config)
    return [out.outputs[0].token_ids for out in outputs], stats


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_matches_hf(folders, smol_tokenizer, name):
    prompts = check_prompts(smol_tokenizer)[:3]  # 6, 97 and 96 tokens
    expected = hf_reference(folders[name], prompts)
    got, stats = octavo_greedy(folders[name], prompts)
    for index, (mine, theirs) in enumerate(zip(got, expected, strict=True)):
        assert mine == theirs, f"prompt {index}: octavo {mine} != transformers {theirs}"
    assert stats.num_preemptions > 0, "the KV pool was meant to force preemption"
