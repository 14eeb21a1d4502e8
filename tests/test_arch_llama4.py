"""Llama 4 text (``Llama4ForCausalLM``): a tiny random checkpoint written by transformers,
greedy fp32 token-identical to HF ``generate`` with chunked prefill, forced preemption and
a prefix-cache hit (``architecture_check``: prompts of 6 to ~90 tokens, an attention chunk
of 16, so every long prompt crosses several chunks), and its parts against transformers'.

Four layers as Llama 4 Scout lays them out: MoE every other layer (1 and 3: 4 experts, a
shared expert), dense MLPs of ``intermediate_size_mlp`` between; layer 3 is NoPE (full
attention, temperature tuning with a ``floor_scale`` of 4 so the query scale changes
within the prompts), the others rotate pairs (Llama 3 rope scaling), L2-norm Q/K and
attend within chunks of 16.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from architecture_check import assert_matches_hf, write_tiny_checkpoint
from octavo.kv_cache.cache_tensors import bytes_per_token
from octavo.model_executor.model_config import ModelConfig
from octavo.model_executor.models.registry import model_class

CHUNK = 16
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 512,
}
CONFIG = {
    "num_hidden_layers": 4,
    "intermediate_size_mlp": 128,
    "num_local_experts": 4,
    "num_experts_per_tok": 1,
    "interleave_moe_layer_step": 2,
    "attention_chunk_size": CHUNK,
    "floor_scale": 4,
    "attn_scale": 0.1,
    "rope_parameters": LLAMA3_ROPE,
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory, smol_tokenizer) -> Path:
    target = tmp_path_factory.mktemp("llama4_text")
    return write_tiny_checkpoint(target, "llama4_text", smol_tokenizer, **CONFIG)


def test_greedy_matches_hf(folder, smol_tokenizer):
    assert_matches_hf(folder, smol_tokenizer)


def test_layers_follow_moe_layers_no_rope_layers_and_layer_types(folder):
    config = ModelConfig.from_folder(folder)
    with torch.device("meta"):
        model = model_class(config.architecture)(config)
    moe = [hasattr(layer.mlp, "routed") for layer in model.layers]
    chunks = [layer.self_attn.options().chunk_size for layer in model.layers]
    rope = [layer.self_attn.choices.uses_rope for layer in model.layers]
    tuned = [layer.self_attn.choices.temperature is not None for layer in model.layers]
    assert moe == [False, True, False, True]
    assert chunks == [CHUNK, CHUNK, CHUNK, None]
    assert rope == [True, True, True, False]
    assert tuned == [False, False, False, True]
    assert config.uniform_sliding_window is None  # chunked layers are no window


def test_kv_bytes_per_token(folder):
    """Keys and values of every layer: 4 layers x 2 x 2 KV heads x 16 (chunked layers keep
    every block for now; Llama 4 Scout: 48 x 2 x 8 x 128 x 2 B = 192 KiB in bf16)."""
    config = ModelConfig.from_folder(folder)
    assert bytes_per_token(config, torch.float32) == 4 * 2 * 2 * 16 * 4


def test_moe_block_equals_hf_with_two_experts_per_token():
    """The routed experts take score-scaled inputs (not weighted outputs), top-2 here, the
    shared expert added: equal to transformers' ``Llama4TextMoe`` on 64 tokens."""
    from transformers import AutoConfig
    from transformers.models.llama4.modeling_llama4 import Llama4TextMoe

    from architecture_check import TINY_SIZES

    raw = {**TINY_SIZES, **CONFIG, "num_experts_per_tok": 2, "vocab_size": 32}
    theirs = Llama4TextMoe(AutoConfig.for_model("llama4_text", **raw)).eval()
    torch.manual_seed(5)
    for parameter in theirs.parameters():
        parameter.data.normal_(0.0, 0.2)
    raw["architectures"] = ["Llama4ForCausalLM"]
    config = ModelConfig.from_dict({**raw, "model_type": "llama4_text"})
    ours = model_class(config.architecture)(config).layers[1].mlp
    for name, tensor in theirs.state_dict().items():
        ours.load_checkpoint_tensor(name.replace("shared_expert.", "shared_experts."), tensor)
    hidden = torch.randn(64, TINY_SIZES["hidden_size"], generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        expected, _ = theirs(hidden)
        got = ours(hidden)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
