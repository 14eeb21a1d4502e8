"""GLM-4.5 MoE (``Glm4MoeForCausalLM``): a tiny random checkpoint written by transformers,
greedy fp32 token-identical to HF ``generate`` with chunked prefill, forced preemption and
a prefix-cache hit (``architecture_check``), and on two tensor-parallel ranks; its router
equal to transformers' on 256 tokens.

The checkpoint sets what GLM-4.5 adds to Llama to values that matter at this size: Q/K/V
biases (none on the output projection), per-head Q/K norms, rope over half of each head,
one dense layer then a MoE layer with a shared expert and 8 routed experts in 4 groups
(2 kept, 2 experts per token), sigmoid scores with a nonzero ``e_score_correction_bias``,
``norm_topk_prob`` and ``routed_scaling_factor`` 1.5.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from architecture_check import (
    NEW_TOKENS,
    assert_matches_hf,
    check_prompts,
    hf_reference,
    write_tiny_checkpoint,
)
from octavo import LLM, SamplingParams
from octavo.model_executor.model_config import ModelConfig
from octavo.model_executor.models.registry import model_class
from test_arch_deepseek import add_correction_bias

HALF_ROTARY = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
GLM4_MOE = {
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "first_k_dense_replace": 1,
    "n_group": 4,
    "topk_group": 2,
    "routed_scaling_factor": 1.5,
    "norm_topk_prob": True,
    "use_qk_norm": True,
    "attention_bias": True,
    "rope_parameters": HALF_ROTARY,
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory, smol_tokenizer) -> Path:
    target = tmp_path_factory.mktemp("glm4_moe")
    made = write_tiny_checkpoint(target, "glm4_moe", smol_tokenizer, **GLM4_MOE)
    add_correction_bias(made)
    return made


@pytest.fixture(scope="module")
def reference(folder, smol_tokenizer) -> list[list[int]]:
    return hf_reference(folder, check_prompts(smol_tokenizer))


def test_greedy_matches_hf(folder, reference, smol_tokenizer):
    assert_matches_hf(folder, smol_tokenizer, reference)


def test_tensor_parallel_2_matches_hf(folder, reference, smol_tokenizer):
    """One KV head, half the Q/K/V biases and each expert's half on each rank: the short
    and the long prompt (prefilled in chunks) as HF writes them."""
    prompts = check_prompts(smol_tokenizer)[:2]
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    args = {"dtype": "float32", "max_model_len": 160, "max_num_batched_tokens": 48}
    args.update(tensor_parallel_size=2, kv_cache_memory=2 << 20)
    with LLM(str(folder), **args) as llm:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [out.outputs[0].token_ids for out in outputs] == reference[:2]


def routers():
    """transformers' GLM-4.5 router and Octavo's, same weights and correction bias."""
    from transformers import AutoConfig
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeTopkRouter

    raw = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4}
    raw.update(GLM4_MOE, vocab_size=32, num_hidden_layers=2, head_dim=16)
    torch.manual_seed(3)
    theirs = Glm4MoeTopkRouter(AutoConfig.for_model("glm4_moe", **raw)).eval()
    theirs.weight.data.normal_(0.0, 1.0)
    theirs.e_score_correction_bias.normal_(0.0, 0.5)
    config = ModelConfig.from_dict(
        {**raw, "model_type": "glm4_moe", "architectures": ["Glm4MoeForCausalLM"]}
    )
    ours = model_class(config.architecture)(config).layers[1].mlp.router
    ours.weight.copy_(theirs.weight)
    ours.e_score_correction_bias.copy_(theirs.e_score_correction_bias)
    return theirs, ours


def test_router_equals_hf():
    """Experts and weights of 256 tokens as transformers chooses them; the group limit and
    the bias changed some tokens' choice, so both are exercised."""
    theirs, ours = routers()
    hidden = torch.randn(256, 64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        _, hf_weights, hf_ids = theirs(hidden)
        weights, ids = ours(hidden)
    assert torch.equal(ids, hf_ids)
    torch.testing.assert_close(weights, hf_weights, rtol=0, atol=0)
    plain = torch.topk(hidden @ ours.weight.T, 2, dim=-1).indices
    changed = int((ids.sort(-1).values != plain.sort(-1).values).any(-1).sum())
    assert 0 < changed < 256
