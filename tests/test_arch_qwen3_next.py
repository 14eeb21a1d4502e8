"""Qwen3-Next: a tiny random checkpoint written by transformers (gated DeltaNet layers around
a gated full-attention layer; MoE with a gated shared expert, one dense layer), greedy fp32
token-identical to HF ``generate`` through ``LLM(folder)`` for a batch of prompts of
different lengths, with chunked prefill (chunks cut the prompts, so the DeltaNet and conv
states carry across chunks) and forced preemption (the KV pool holds fewer tokens than the
batch needs: preempted sequences restart from a fresh state slot); the long prompt again
on two tensor-parallel ranks. Prefix caching is off for state layers. Also: only the
attention layer has KV blocks, and each sequence's state is the DeltaNet layers' conv
windows and delta-rule matrices.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from architecture_check import NEW_TOKENS, check_prompts, hf_reference, write_tiny_checkpoint
from octavo import LLM, SamplingParams
from octavo.kv_cache.cache_tensors import bytes_per_block
from octavo.model_executor.model_config import ModelConfig
from octavo.model_executor.models.registry import model_class

LINEAR = {
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
}
CONFIG = {
    **LINEAR,
    "num_hidden_layers": 3,
    "layer_types": ["linear_attention", "full_attention", "linear_attention"],
    "mlp_only_layers": [2],  # a dense MLP of intermediate_size
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 48,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "partial_rotary_factor": 0.25,  # 4 of each head's 16 dims rotate
}
MAX_NUM_SEQS, KV_BLOCKS = 4, 11  # 176 tokens of KV while the batch needs ~235
# per DeltaNet layer: conv window (q, k, v channels x 3 taps) + a 16 x 8 matrix per value head
STATE_VALUES = (2 * 2 * 16 + 4 * 8) * 3 + 4 * 16 * 8


@pytest.fixture(scope="module")
def folder(tmp_path_factory, smol_tokenizer) -> Path:
    target = tmp_path_factory.mktemp("qwen3_next")
    return write_tiny_checkpoint(target, "qwen3_next", smol_tokenizer, **CONFIG)


@pytest.fixture(scope="module")
def expected(folder, smol_tokenizer) -> list[list[int]]:
    """HF's greedy tokens for three check prompts (6, 97 and 96 tokens)."""
    return hf_reference(folder, check_prompts(smol_tokenizer)[:3])


def kv_memory(config: ModelConfig) -> int:
    """The state slots of ``MAX_NUM_SEQS`` sequences (and the null slot), then
    ``KV_BLOCKS`` blocks of the one attention layer."""
    attention = dataclasses.replace(config, num_layers=1)
    states = (MAX_NUM_SEQS + 1) * 2 * STATE_VALUES * 4
    return states + KV_BLOCKS * bytes_per_block(attention, 16, torch.float32)


def test_greedy_matches_hf_with_chunked_prefill_and_preemption(folder, expected, smol_tokenizer):
    prompts = check_prompts(smol_tokenizer)[:3]
    args = {
        "dtype": "float32",
        "max_model_len": 160,
        "max_num_batched_tokens": 48,
        "max_num_seqs": MAX_NUM_SEQS,
        "kv_cache_memory": kv_memory(ModelConfig.from_folder(folder)),
    }
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    with LLM(str(folder), **args) as llm:
        outputs = llm.generate(prompts, params, use_tqdm=False)
        stats = llm.engine.stats()
    for index, output in enumerate(outputs):
        got = output.outputs[0].token_ids
        assert got == expected[index], f"prompt {index}: octavo {got} != HF {expected[index]}"
    assert stats.num_preemptions > 0, "the KV pool was meant to force preemption"


def test_tensor_parallel_2_matches_hf(folder, expected, smol_tokenizer):
    """Each rank keeps one of the two DeltaNet key heads (with its value heads, conv
    channels, decay rates and state), two of the four attention heads (query and gate
    pairs) and half of each expert: the long prompt as HF writes it."""
    prompts = check_prompts(smol_tokenizer)[1:2]
    args = {"dtype": "float32", "max_model_len": 160, "max_num_batched_tokens": 48}
    args.update(tensor_parallel_size=2, max_num_seqs=MAX_NUM_SEQS, kv_cache_memory=2 << 20)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    with LLM(str(folder), **args) as llm:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [out.outputs[0].token_ids for out in outputs] == expected[1:2]


def test_state_and_kv_per_sequence(folder):
    """Only the full-attention layer has KV blocks; the two DeltaNet layers keep a state
    slot each: ``STATE_VALUES`` values of the model's dtype per sequence and layer."""
    config = ModelConfig.from_folder(folder)
    with torch.device("meta"):
        model = model_class(config.architecture)(config)
    specs = model.state_specs()
    assert [spec is None for spec in specs] == [False, True, False]
    assert specs[0].bytes_per_slot(torch.bfloat16) == STATE_VALUES * 2
    assert [type(layer.self_attn).__name__ for layer in model.layers] == [
        "GatedDeltaNet",
        "GatedAttention",
        "GatedDeltaNet",
    ]
