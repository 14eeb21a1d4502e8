"""Features together (issue 26, item 11): each combination is either token-identical to its
reference (greedy fp32: the same engine without the added feature) or refused
by name at startup — never a wrong answer.

- speculative decoding (n-gram) + LoRA: identical to LoRA without speculation;
- speculative decoding + int8: identical to int8 without speculation;
- speculative decoding + structured output: identical to structured output without it
  (constrained sequences do not speculate);
- LoRA + int8: a zero adapter leaves int8's tokens unchanged, a real one changes them;
- LoRA + pipeline parallelism: identical to LoRA on one process.
(LoRA alone is checked against HF + PEFT in test_lora.py.)
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from octavo import LLM, SamplingParams
from octavo.lora_request import LoRARequest
from octavo.structured_output.params import StructuredOutputsParams

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
GREEDY = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
ENGINE = {"dtype": "float32", "max_model_len": 128, "kv_cache_memory": 16 << 20}
PROMPTS = [[(seed * 131 + i * 17) % 40000 + 10 for i in range(7)] * 3 for seed in range(2)]


@pytest.fixture(scope="module")
def base(tiny_folder):
    return tiny_folder("qwen2")


@pytest.fixture(scope="module")
def adapter(base, tmp_path_factory) -> LoRARequest:
    folder = write_adapter(base, tmp_path_factory.mktemp("combo-lora"), scale=0.1)
    return LoRARequest("combo", 1, str(folder))


@pytest.fixture(scope="module")
def lora_reference(base, adapter) -> list[list[int]]:
    """LoRA alone: one process, no speculation, no quantization."""
    return greedy_tokens(lora_engine(base), adapter)


def write_adapter(base: Path, folder: Path, scale: float, rank: int = 8) -> Path:
    """A PEFT-format adapter of q_proj and v_proj with random A and B (``scale`` 0: a zero
    delta), written directly (peft itself is not needed)."""
    config = json.loads((base / "config.json").read_text())
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    head_dim = hidden // config["num_attention_heads"]
    outputs = {"q_proj": hidden, "v_proj": config["num_key_value_heads"] * head_dim}
    generator = torch.Generator().manual_seed(3)
    tensors = {}
    for layer, (module, out) in itertools.product(range(layers), outputs.items()):
        prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
        tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, hidden, generator=generator)
        tensors[f"{prefix}.lora_B.weight"] = torch.randn(out, rank, generator=generator) * scale
    save_file(tensors, folder / "adapter_model.safetensors")
    settings = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 2 * rank,
        "bias": "none",
        "target_modules": list(outputs),
        "task_type": "CAUSAL_LM",
    }
    (folder / "adapter_config.json").write_text(json.dumps(settings))
    return folder


def greedy_tokens(llm: LLM, lora_request: LoRARequest | None = None, params=GREEDY):
    outputs = llm.generate(PROMPTS, params, use_tqdm=False, lora_request=lora_request)
    return [list(out.outputs[0].token_ids) for out in outputs]


def lora_engine(base, **engine) -> LLM:
    return LLM(str(base), enable_lora=True, max_lora_rank=8, **{**ENGINE, **engine})


def test_speculative_decoding_with_lora_matches_lora_alone(base, adapter, lora_reference):
    llm = lora_engine(base, speculative_config=NGRAM)
    assert greedy_tokens(llm, adapter) == lora_reference
    assert greedy_tokens(llm) != lora_reference  # the adapter does change the output
    assert llm.engine.scheduler.spec_counters.num_draft_tokens > 0


def test_speculative_decoding_with_int8_matches_int8_alone(base):
    reference = greedy_tokens(LLM(str(base), quantization="int8", **ENGINE))
    llm = LLM(str(base), quantization="int8", speculative_config=NGRAM, **ENGINE)
    assert greedy_tokens(llm) == reference
    assert llm.engine.scheduler.spec_counters.num_draft_tokens > 0


def test_speculative_decoding_with_structured_output_matches_it_alone(base):
    constrained = SamplingParams(
        max_tokens=16,
        temperature=0,
        structured_outputs=StructuredOutputsParams(regex="(ab|cd){2,6}"),
    )
    reference = greedy_tokens(LLM(str(base), **ENGINE), params=constrained)
    llm = LLM(str(base), speculative_config=NGRAM, **ENGINE)
    assert greedy_tokens(llm, params=constrained) == reference
    assert greedy_tokens(llm) == greedy_tokens(LLM(str(base), **ENGINE))  # unconstrained too


def test_lora_with_int8_applies_the_adapter(base, adapter, tmp_path):
    zero = write_adapter(base, tmp_path, scale=0.0)
    int8 = greedy_tokens(LLM(str(base), quantization="int8", **ENGINE))
    llm = lora_engine(base, quantization="int8")
    assert greedy_tokens(llm, LoRARequest("zero", 2, str(zero))) == int8
    assert greedy_tokens(llm, adapter) != int8


def test_lora_with_pipeline_parallelism_matches_lora_alone(base, adapter, lora_reference):
    llm = lora_engine(base, pipeline_parallel_size=2)
    try:
        assert greedy_tokens(llm, adapter) == lora_reference
    finally:
        llm.engine.shutdown()
