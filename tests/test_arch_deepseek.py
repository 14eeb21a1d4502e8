"""DeepSeek-V2 (V2-Lite-shaped) and DeepSeek-V3 (R1 / Kimi K2-shaped): tiny random
checkpoints written by transformers, greedy fp32 token-identical to HF ``generate`` with
chunked prefill (chunks cut the prompts), forced preemption and a prefix-cache hit
(``architecture_check``); the MLA cache's bytes per token from its formula.

Both have one dense layer, then MoE layers with a shared expert and 8 routed experts in 4
groups, 2 experts per token. V2-Lite-shaped: a full-rank ``q_proj``, ``group_limited_greedy``
routing (1 group kept), ``routed_scaling_factor``, YaRN rope with DeepSeek's ``mscale`` /
``mscale_all_dim`` (the softmax scale too). V3-shaped: low-rank queries
(``q_a_proj``/``q_b_proj``), sigmoid routing over 2 kept groups with a nonzero
``e_score_correction_bias``, ``norm_topk_prob``, interleaved rope; also run on two
tensor-parallel ranks, and its decode steps once more through decode-graph buffers (CUDA
graphs' path, re-run on CPU). The routers equal transformers' on 256 tokens, the group
limit and the bias changing some tokens' experts.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from architecture_check import (
    NEW_TOKENS,
    assert_matches_hf,
    check_prompts,
    hf_reference,
    write_tiny_checkpoint,
)
from octavo import LLM, SamplingParams
from octavo.kv_cache.cache_tensors import bytes_per_token
from octavo.model_executor.decode_graphs import DecodeGraphs
from octavo.model_executor.model_config import ModelConfig
from octavo.model_executor.models.registry import model_class
from octavo.model_executor.rotary import mla_softmax_scale

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
        "topk_group": 1,  # with 2 of 4 groups, V2's best-expert group score never binds
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


@pytest.fixture(scope="module")
def references(folders, smol_tokenizer) -> dict[str, list[list[int]]]:
    """HF's greedy tokens for the check prompts, once per model type."""
    prompts = check_prompts(smol_tokenizer)
    return {model_type: hf_reference(folder, prompts) for model_type, folder in folders.items()}


def through_decode_graphs(prompts: list[list[int]], expected: list[list[int]]):
    """A last check on the engine: two prompts again, their decode steps through a graph's
    persistent buffers (padding rows with slot -1, the context width of
    ``max_model_len``): the path a GPU captures, recorded on CPU by re-running it."""

    from test_decode_graphs import RerunRecorder  # a CPU stand-in for CUDA graph capture

    def check(llm: LLM) -> None:
        runner = llm.engine.executor.worker.runner
        latent = MLA["kv_lora_rank"] + MLA["qk_rope_head_dim"]
        # the pool was sized for 11 blocks of latents (architecture_check): all 11 are here
        assert runner.kv_caches[0].shape == (1, 11, 16, 1, latent)
        recorder = RerunRecorder()
        runner.graphs = DecodeGraphs(runner.paged, [1, 4], 160, recorder)
        runner.graphs.capture()
        params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
        outputs = llm.generate(prompts[:2], params, use_tqdm=False)  # padded to 4 rows
        assert recorder.replays >= NEW_TOKENS - 1
        assert [out.outputs[0].token_ids for out in outputs] == expected[:2]

    return check


@pytest.mark.parametrize("model_type", list(CONFIGS))
def test_greedy_matches_hf(folders, references, smol_tokenizer, model_type):
    expected, then = references[model_type], None
    if model_type == "deepseek_v3":
        then = through_decode_graphs(check_prompts(smol_tokenizer), expected)
    assert_matches_hf(folders[model_type], smol_tokenizer, expected, then)


def test_tensor_parallel_2_matches_hf(folders, references, smol_tokenizer):
    """Heads split over two ranks, the latent cache whole on each, experts split: the short
    and the long prompt (prefilled in two chunks) as HF writes them."""
    prompts = check_prompts(smol_tokenizer)[:2]
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    args = {"dtype": "float32", "max_model_len": 160, "max_num_batched_tokens": 48}
    args.update(tensor_parallel_size=2, kv_cache_memory=2 << 20)  # per rank: ~4,400 tokens
    with LLM(str(folders["deepseek_v3"]), **args) as llm:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    got = [out.outputs[0].token_ids for out in outputs]
    assert got == references["deepseek_v3"][:2]


def test_dense_and_moe_layers_follow_first_k_dense_replace_and_moe_layer_freq():
    """Layers below ``first_k_dense_replace`` are dense, then every ``moe_layer_freq``-th is
    MoE (vLLM's rule; transformers ignores the key, 1 in every released config)."""
    raw = {**TINY_ROUTER, **CONFIGS["deepseek_v3"], "num_hidden_layers": 6}
    raw.update(moe_layer_freq=2, architectures=["DeepseekV3ForCausalLM"])
    config = ModelConfig.from_dict({**raw, "model_type": "deepseek_v3"})
    with torch.device("meta"):
        model = model_class(config.architecture)(config)
    sparse = [hasattr(layer.mlp, "routed") for layer in model.layers]
    assert sparse == [False, False, True, False, True, False]


def test_softmax_scale_is_transformers_yarn_mscale():
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import yarn_apply_mscale

    default = {"rope_type": "default", "rope_theta": 10000.0}
    for rope in (YARN, {**YARN, "mscale_all_dim": 0}, {**YARN, "factor": 40.0}, default):
        assert mla_softmax_scale(24, rope) == yarn_apply_mscale(rope, 24**-0.5)
    assert mla_softmax_scale(24, YARN) != 24**-0.5


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


def routers(model_type: str, **overrides):
    """HF's router of a MoE layer and Octavo's (same weights, a nonzero correction bias)."""
    from transformers import AutoConfig
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    raw = {**TINY_ROUTER, **CONFIGS[model_type], "num_hidden_layers": 2, **overrides}
    hf_class = {"deepseek_v2": DeepseekV2TopkRouter, "deepseek_v3": DeepseekV3TopkRouter}
    torch.manual_seed(3)
    theirs = hf_class[model_type](AutoConfig.for_model(model_type, **raw)).eval()
    theirs.weight.data.normal_(0.0, 1.0)
    architecture = {"deepseek_v2": "DeepseekV2ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM"}
    raw["architectures"] = [architecture[model_type]]
    config = ModelConfig.from_dict({**raw, "model_type": model_type})
    model = model_class(config.architecture)(config).to(torch.bfloat16)
    ours = model.layers[1].mlp.router  # float32 in a bf16 model, as transformers keeps it
    ours.weight.copy_(theirs.weight)
    if model_type == "deepseek_v3":
        theirs.e_score_correction_bias.normal_(0.0, 0.5)
        ours.e_score_correction_bias.copy_(theirs.e_score_correction_bias)
    return theirs, ours


TINY_ROUTER = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4}
TINY_ROUTER.update(vocab_size=32, max_position_embeddings=512)


@pytest.mark.parametrize(
    ("model_type", "overrides"),
    [("deepseek_v2", {}), ("deepseek_v2", {"topk_method": "greedy"}), ("deepseek_v3", {})],
    ids=["v2-group-limited", "v2-greedy", "v3"],
)
def test_router_equals_hf(model_type, overrides):
    """Experts and weights of 256 tokens equal to transformers' router; the group limit (and
    V3's correction bias) changed the choice of some tokens, so both are exercised (V2's
    ``greedy``, V2-Lite's setting, is plain top-k of the softmax)."""
    theirs, ours = routers(model_type, **overrides)
    hidden = torch.randn(256, 64, generator=torch.Generator().manual_seed(5)).bfloat16()
    with torch.no_grad():
        _, hf_weights, hf_ids = theirs(hidden)
        weights, ids = ours(hidden)
    assert torch.equal(ids, hf_ids)
    torch.testing.assert_close(weights, hf_weights, rtol=0, atol=0)
    assert ours.weight.dtype == torch.float32
    plain = torch.topk(ours.weight @ hidden.T.float(), 2, dim=0).indices.T
    changed = int((ids.sort(-1).values != plain.sort(-1).values).any(-1).sum())
    assert changed == 0 if overrides else 0 < changed < 256
