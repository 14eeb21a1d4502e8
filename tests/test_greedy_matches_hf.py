"""Greedy fp32 output must be token-identical to HF transformers, whatever the batching.

Eight prompts of mixed lengths run as one batch; one prompt is longer than the per-step
token budget (chunked prefill), and a second run squeezes the KV pool until sequences
are preempted and recomputed.
"""

from __future__ import annotations

import pytest
import torch

from octavo import LLM
from octavo.kernels import cpu_build
from octavo.kv_cache.cache_tensors import bytes_per_block
from octavo.model_executor.model_config import ModelConfig

from conftest import assert_all_blocks_free, hf_greedy
from greedy_prompts import MAX_NEW_TOKENS, mixed_prompts, run_batch


@pytest.fixture(scope="module")
def smol_reference(hf_smol, smol_tokenizer):
    prompts = mixed_prompts(smol_tokenizer)
    return prompts, [hf_greedy(hf_smol, prompt, MAX_NEW_TOKENS) for prompt in prompts]


def test_prompts_cover_chunked_prefill(smol_reference):
    prompts, _ = smol_reference
    lengths = sorted(len(prompt) for prompt in prompts)
    assert lengths[0] < 64 < lengths[-1], lengths


def test_smollm2_batch_with_chunked_prefill(smol_folder, smol_reference):
    prompts, expected = smol_reference
    llm = LLM(str(smol_folder), dtype="float32", max_model_len=512, max_num_batched_tokens=64)
    assert run_batch(llm, prompts) == expected
    assert_all_blocks_free(llm.engine)


def test_smollm2_on_the_torch_path_without_native_kernels(smol_folder, smol_reference):
    """The fallback for machines without a compiler: same tokens, with no native kernel."""
    prompts, expected = smol_reference
    cpu_build.use_torch_path()
    try:
        llm = LLM(str(smol_folder), dtype="float32", max_model_len=512, max_num_batched_tokens=64)
        assert type(llm.engine.executor.worker.runner.attention).__name__ == "TorchAttention"
        assert run_batch(llm, prompts) == expected
    finally:
        cpu_build.use_torch_path(False)


def test_smollm2_batch_with_preemption(smol_folder, smol_reference):
    prompts, expected = smol_reference
    block_bytes = 2 * 16 * 3 * 64 * 4 * 30  # K+V, block of 16, 3 KV heads of 64, fp32, 30 layers
    llm = LLM(
        str(smol_folder),
        dtype="float32",
        max_model_len=384,
        max_num_batched_tokens=128,
        kv_cache_memory=30 * block_bytes,
    )
    assert run_batch(llm, prompts) == expected
    assert llm.engine.stats().num_preemptions > 0
    assert_all_blocks_free(llm.engine)


@pytest.mark.parametrize("name", ["qwen2", "llama3"])
def test_tiny_models_match_hf(name, tiny_folder, smol_tokenizer):
    from transformers import AutoModelForCausalLM

    folder = tiny_folder(name)
    hf_model = AutoModelForCausalLM.from_pretrained(folder, dtype="float32").eval()
    prompts = mixed_prompts(smol_tokenizer)
    expected = [hf_greedy(hf_model, prompt, MAX_NEW_TOKENS) for prompt in prompts]
    block_bytes = bytes_per_block(ModelConfig.from_folder(folder), 16, torch.float32)
    llm = LLM(
        str(folder),
        dtype="float32",
        max_model_len=384,
        max_num_batched_tokens=48,
        kv_cache_memory=30 * block_bytes,
    )
    assert run_batch(llm, prompts) == expected
    assert llm.engine.stats().num_preemptions > 0
    assert_all_blocks_free(llm.engine)
