"""Qwen 3 (dense), Qwen 3 MoE and Mixtral: tiny random checkpoints written by transformers,
greedy fp32 token-identical to HF ``generate`` (chunked prefill, preemption, prefix-cache
hits), MoE router choices equal to HF's, tensor parallel 2 (experts split, or placed whole
per rank with ``enable_expert_parallel``), int8 experts, and LoRA on the attention of a MoE
model (an adapter for the feed-forward projections is refused by name).

Mixtral and the dense Qwen 3 get a sliding window (32 tokens) smaller than the long
prompts (~96 tokens); the dense Qwen 3's is on its second layer only (``max_window_layers``),
so one model has full and sliding layers.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from architecture_check import (
    assert_matches_hf,
    check_prompts,
    hf_reference,
    write_tiny_checkpoint,
)
from octavo import LLM, SamplingParams
from octavo.lora_request import LoRARequest
from octavo.model_executor.layers.moe import FusedMoE
from octavo.model_executor.model_config import ModelConfig
from octavo.model_executor.models.qwen3_moe import Qwen3MoeForCausalLM

from conftest import hf_greedy
from lora_adapters import hf_with_adapter, make_adapter, variant

WINDOW = 32
MOE = {"num_experts_per_tok": 2}
QWEN3 = {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1}
QWEN3_MOE = {
    **MOE,
    "num_experts": 4,
    "moe_intermediate_size": 32,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
}
MIXTRAL = {**MOE, "num_local_experts": 4, "sliding_window": WINDOW}
# The engines outside the architecture check: room for their few prompts (the CPU default,
# 2 GiB, would only cost the time and memory of zeroing it).
KV_CACHE_MEMORY = 8 << 20


@pytest.fixture(scope="module")
def folders(tmp_path_factory, smol_tokenizer) -> dict[str, Path]:
    made: dict[str, Path] = {}

    def folder(model_type: str) -> Path:
        if model_type not in made:
            config = {"qwen3": QWEN3, "qwen3_moe": QWEN3_MOE, "mixtral": MIXTRAL}[model_type]
            target = tmp_path_factory.mktemp(model_type)
            made[model_type] = write_tiny_checkpoint(target, model_type, smol_tokenizer, **config)
        return made[model_type]

    return folder


@pytest.fixture(scope="module")
def references(folders, smol_tokenizer):
    """HF's greedy tokens for the check prompts, computed once per model type."""
    made: dict[str, list[list[int]]] = {}

    def reference(model_type: str) -> list[list[int]]:
        if model_type not in made:
            made[model_type] = hf_reference(folders(model_type), check_prompts(smol_tokenizer))
        return made[model_type]

    return reference


@pytest.mark.parametrize("model_type", ["qwen3", "qwen3_moe", "mixtral"])
def test_greedy_matches_hf(folders, references, smol_tokenizer, model_type):
    assert_matches_hf(folders(model_type), smol_tokenizer, references(model_type))


@pytest.mark.parametrize(
    ("model_type", "expert_parallel"),
    [
        ("qwen3", False),
        ("qwen3_moe", False),
        pytest.param("qwen3_moe", True),
    ],
    ids=["qwen3", "qwen3_moe-experts-split", "qwen3_moe-expert-parallel"],
)
def test_tensor_parallel_2_matches_hf(
    folders, references, smol_tokenizer, model_type, expert_parallel
):
    moe = {"enable_expert_parallel": True} if expert_parallel else {}
    folder, expected = folders(model_type), references(model_type)
    assert_matches_hf(folder, smol_tokenizer, expected, tensor_parallel_size=2, **moe)


def engine_model(llm: LLM):
    return llm.engine.executor.worker.model


@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral"])
def test_router_choices_equal_hf(folders, smol_tokenizer, model_type):
    """Each MoE layer's top-k experts for every prompt token, Octavo's router vs HF's
    (``mlp.gate`` / ``block_sparse_moe.gate``), on the same prompt in one prefill."""
    from transformers import AutoModelForCausalLM

    folder, prompt = folders(model_type), check_prompts(smol_tokenizer)[1]
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    hf_gates = [layer.mlp.gate for layer in hf.model.layers]
    theirs = record_experts(hf_gates, lambda output: output[2])
    with torch.no_grad():
        hf(torch.tensor([prompt]))
    with LLM(
        str(folder), dtype="float32", max_model_len=160, kv_cache_memory=KV_CACHE_MEMORY
    ) as llm:
        routers = [layer.mlp.router for layer in engine_model(llm).layers]
        mine = record_experts(routers, lambda output: output[1])
        params = SamplingParams(temperature=0.0, max_tokens=1)
        llm.generate([prompt], params, use_tqdm=False)
    assert len(mine) == len(theirs) == len(hf_gates)
    for layer, (ours, hfs) in enumerate(zip(mine, theirs, strict=True)):
        assert torch.equal(ours[0].sort(-1).values, hfs[0].sort(-1).values), layer


def record_experts(modules, expert_ids) -> list[list[torch.Tensor]]:
    """Per module, the expert ids of each call (a list filled as the modules run)."""
    calls: list[list[torch.Tensor]] = [[] for _ in modules]
    for index, module in enumerate(modules):

        def hook(_module, _args, output, index=index):
            calls[index].append(expert_ids(output).reshape(-1, MOE["num_experts_per_tok"]))

        module.register_forward_hook(hook)
    return calls


def test_sparse_layers_follow_decoder_sparse_step_and_mlp_only_layers(smol_tokenizer):
    """Which layers are MoE: the same rule as transformers' Qwen3MoeDecoderLayer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    raw = {**QWEN3_MOE, "decoder_sparse_step": 2, "mlp_only_layers": [3], "num_hidden_layers": 6}
    raw.update(hidden_size=16, intermediate_size=8, num_attention_heads=2, head_dim=8)
    raw.update(num_key_value_heads=1, vocab_size=32, architectures=["Qwen3MoeForCausalLM"])
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen3_moe", **raw))
    theirs = [hasattr(layer.mlp, "gate") for layer in hf.model.layers]
    config = ModelConfig.from_dict({**raw, "model_type": "qwen3_moe"})
    with torch.device("meta"):
        model = Qwen3MoeForCausalLM(config)
    mine = [isinstance(layer.mlp, FusedMoE) for layer in model.layers]
    assert mine == theirs == [False, True, False, False, False, True]


def test_int8_quantizes_the_experts(folders, smol_tokenizer):
    """``--quantization int8`` covers the experts (W8A8, lossy): the experts are int8 after
    loading, and the greedy first token of each prompt is fp32 HF's."""
    from transformers import AutoModelForCausalLM

    folder, prompts = folders("qwen3_moe"), check_prompts(smol_tokenizer)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    expected = [hf_greedy(hf, prompt, 1) for prompt in prompts]
    params = SamplingParams(temperature=0.0, max_tokens=1)
    with LLM(
        str(folder),
        dtype="float32",
        max_model_len=160,
        quantization="int8",
        kv_cache_memory=KV_CACHE_MEMORY,
    ) as llm:
        experts = [layer.mlp for layer in engine_model(llm).layers]
        outputs = llm.generate(prompts, params, use_tqdm=False)
    assert all(moe.w13 is None and moe.quantized is not None for moe in experts)
    assert [list(out.outputs[0].token_ids) for out in outputs] == expected


def test_lora_on_attention_of_a_moe_model_matches_hf_peft(folders, smol_tokenizer, tmp_path):
    """An attention adapter serves as HF + PEFT runs it; a request with one that also
    adapts the feed-forward projections fails by name (they are experts here: the worker
    refuses to load it) and the engine goes on serving."""
    folder, prompt = folders("qwen3_moe"), check_prompts(smol_tokenizer)[0]
    attention = ["q_proj", "k_proj", "v_proj", "o_proj"]
    adapter = make_adapter(folder, tmp_path / "attention", seed=5, rank=8, targets=attention)
    expected = hf_greedy(hf_with_adapter(folder, adapter), prompt, 8, ignore_eos=True)
    with_mlp = variant(adapter, tmp_path / "mlp", tensors=add_mlp_lora(folder, rank=8))
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    with LLM(
        str(folder),
        dtype="float32",
        max_model_len=160,
        enable_lora=True,
        kv_cache_memory=KV_CACHE_MEMORY,
    ) as llm:
        (refused,) = llm.generate(
            [prompt], params, use_tqdm=False, lora_request=LoRARequest("mlp", 2, str(with_mlp))
        )
        request = LoRARequest("attention", 1, str(adapter))
        (out,) = llm.generate([prompt], params, use_tqdm=False, lora_request=request)
    assert list(out.outputs[0].token_ids) == expected
    assert refused.outputs[0].finish_reason == "error"
    assert "LoRA on down_proj, gate_proj, up_proj is not supported" in refused.error
    assert "feed-forward layers are experts" in refused.error


def add_mlp_lora(folder: Path, rank: int):
    """Adds PEFT's gate/up/down_proj LoRA tensors (as a dense-MLP adapter has) on layer 0."""
    config = ModelConfig.from_folder(folder)
    hidden, inter = config.hidden_size, config.intermediate_size
    shapes = {
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }

    def add(tensors: dict) -> dict:
        added = dict(tensors)
        for module, (fan_in, fan_out) in shapes.items():
            prefix = f"base_model.model.model.layers.0.mlp.{module}"
            added[f"{prefix}.lora_A.weight"] = torch.full((rank, fan_in), 0.01)
            added[f"{prefix}.lora_B.weight"] = torch.full((fan_out, rank), 0.01)
        return added

    return add
