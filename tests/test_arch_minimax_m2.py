"""MiniMax-M2 (``MiniMaxM2ForCausalLM``): a tiny random checkpoint written by transformers,
greedy fp32 token-identical to HF ``generate`` with chunked prefill, forced preemption and
a prefix-cache hit (``architecture_check``); its router equal to transformers' on 256
tokens.

The checkpoint sets what MiniMax-M2 adds to Mixtral to values that matter at this size:
Q/K norms over all heads together, rope over half of each head (``rotary_dim`` 8 of 16),
8 experts in every layer (2 per token) picked by sigmoid scores plus a nonzero
``e_score_correction_bias`` (on ``block_sparse_moe``, as transformers saves it).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from architecture_check import assert_matches_hf, write_tiny_checkpoint
from octavo.model_executor.model_config import ModelConfig
from octavo.model_executor.models.registry import model_class
from test_arch_deepseek import add_correction_bias

MINIMAX_M2 = {"num_local_experts": 8, "num_experts_per_tok": 2, "rotary_dim": 8}


@pytest.fixture(scope="module")
def folder(tmp_path_factory, smol_tokenizer) -> Path:
    target = tmp_path_factory.mktemp("minimax_m2")
    made = write_tiny_checkpoint(target, "minimax_m2", smol_tokenizer, **MINIMAX_M2)
    add_correction_bias(made)
    return made


def test_greedy_matches_hf(folder, smol_tokenizer):
    assert_matches_hf(folder, smol_tokenizer)


def test_rotary_dim_is_half_of_each_head(folder):
    config = ModelConfig.from_folder(folder)
    model = model_class(config.architecture)(config)
    assert model.rope_parameters()["full_attention"]["partial_rotary_factor"] == 0.5


def routers():
    """transformers' MiniMax-M2 router (and its block's correction bias) and Octavo's."""
    from transformers import AutoConfig
    from transformers.models.minimax_m2.modeling_minimax_m2 import MiniMaxM2TopKRouter

    raw = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4}
    raw.update(MINIMAX_M2, vocab_size=32, num_hidden_layers=1, head_dim=16)
    torch.manual_seed(3)
    theirs = MiniMaxM2TopKRouter(AutoConfig.for_model("minimax_m2", **raw)).eval()
    theirs.weight.data.normal_(0.0, 1.0)
    bias = torch.randn(MINIMAX_M2["num_local_experts"]) * 0.5
    config = ModelConfig.from_dict(
        {**raw, "model_type": "minimax_m2", "architectures": ["MiniMaxM2ForCausalLM"]}
    )
    ours = model_class(config.architecture)(config).layers[0].mlp.router
    ours.weight.copy_(theirs.weight)
    ours.e_score_correction_bias.copy_(bias)
    return theirs, bias, ours


def test_router_equals_hf():
    """Experts and weights of 256 tokens as transformers chooses them; the bias changed
    some tokens' choice, so the choice and the weights are seen to differ in source."""
    theirs, bias, ours = routers()
    hidden = torch.randn(256, 64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        _, hf_weights, hf_ids = theirs(hidden, bias)
        weights, ids = ours(hidden)
    assert torch.equal(ids, hf_ids)
    torch.testing.assert_close(weights, hf_weights, rtol=0, atol=0)
    plain = torch.topk(hidden @ ours.weight.T, 2, dim=-1).indices
    changed = int((ids.sort(-1).values != plain.sort(-1).values).any(-1).sum())
    assert 0 < changed < 256
