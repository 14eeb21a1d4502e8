"""`octavo_bench random-model`: every preset is an architecture Octavo runs, and a built
folder loads in Octavo (shrunk here: the real presets are SmolLM2-sized)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig

from octavo import LLM, SamplingParams
from octavo.model_executor.models.registry import supported_architectures
from octavo_bench import random_model
from octavo_bench.cli import build_parser

ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM",
    "qwen3_next": "Qwen3NextForCausalLM",
}
TINY_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}


@pytest.mark.parametrize("preset", sorted(random_model.PRESETS))
def test_presets_are_supported_architectures(preset):
    model_type, shape = random_model.PRESETS[preset]
    AutoConfig.for_model(model_type, **shape)  # a config transformers accepts
    assert ARCHITECTURES[model_type] in supported_architectures()


def test_a_built_folder_serves(tmp_path, monkeypatch):
    tiny = {
        **TINY_SHAPE,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
    }
    monkeypatch.setitem(random_model.PRESETS, "qwen3-moe", ("qwen3_moe", tiny))
    args = build_parser().parse_args(["random-model", "qwen3-moe", str(tmp_path / "m")])
    assert args.func(args) == 0
    folder = random_model.build_random_model("qwen3-moe", tmp_path / "m")  # kept as it is
    with LLM(str(folder), dtype="float32", max_model_len=64, kv_cache_memory=2**22) as llm:
        params = SamplingParams(max_tokens=4, ignore_eos=True)
        (out,) = llm.generate([[1, 2, 3]], params, use_tqdm=False)
    assert len(out.outputs[0].token_ids) == 4


@pytest.mark.parametrize(("preset", "billions"), [("llama-8b", 8.03), ("qwen3-0.6b", 0.596)])
def test_the_gpu_benchmark_presets_have_the_real_models_size(preset, billions):
    from transformers import AutoModelForCausalLM

    model_type, shape = random_model.PRESETS[preset]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **shape))
    assert sum(p.numel() for p in model.parameters()) / 1e9 == pytest.approx(billions, rel=0.01)


def test_a_config_only_folder_runs_with_dummy_weights(tmp_path, monkeypatch):
    tiny = {**TINY_SHAPE, "vocab_size": 60000}  # past the embedded tokenizer's 49152 ids
    monkeypatch.setitem(random_model.PRESETS, "qwen3-0.6b", ("qwen3", tiny))
    args = build_parser().parse_args(["random-model", "qwen3-0.6b", str(tmp_path), "--config-only"])
    assert args.func(args) == 0
    assert not list(tmp_path.glob("*.safetensors"))
    engine = dict(dtype="float32", max_model_len=64, kv_cache_memory=2**22, load_format="dummy")
    with LLM(str(tmp_path), **engine) as llm:
        assert llm.engine.vocab_size == 60000
        params = SamplingParams(max_tokens=4, ignore_eos=True)
        (out,) = llm.generate([[1, 2, 3]], params, use_tqdm=False)
    assert len(out.outputs[0].token_ids) == 4
