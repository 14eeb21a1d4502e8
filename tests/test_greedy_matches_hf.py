"""Greedy fp32 output must be token-identical to HF transformers, whatever the batching.

Eight prompts of mixed lengths run as one batch; one prompt is longer than the per-step
token budget (chunked prefill), and a second run squeezes the KV pool until sequences
are preempted and recomputed. The HF reference is computed once for the module; the
torch-path and preemption runs take a subset of the prompts that still chunks its
prefills (and, for the second, is still preempted), as the tests assert.
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

CHUNK_BUDGET = 64  # max_num_batched_tokens of the chunked runs
# The three shortest prompts (37, 78 and 121 tokens): two of them prefill in chunks.
TORCH_PATH_PROMPTS = [0, 1, 2]
# The four shortest prompts, in a pool too small for them all: still preempted.
PREEMPTION_PROMPTS = [0, 1, 2, 3]


@pytest.fixture(scope="module")
def smol_reference(hf_smol, smol_tokenizer):
    prompts = mixed_prompts(smol_tokenizer)
    return prompts, [hf_greedy(hf_smol, prompt, MAX_NEW_TOKENS) for prompt in prompts]


def subset(
    reference: tuple[list[list[int]], list[list[int]]], indices: list[int]
) -> tuple[list[list[int]], list[list[int]]]:
    """The prompts at ``indices`` and their HF continuations."""
    prompts, expected = reference
    return [prompts[i] for i in indices], [expected[i] for i in indices]


def assert_some_prefill_is_chunked(prompts: list[list[int]], budget: int) -> None:
    lengths = sorted(len(prompt) for prompt in prompts)
    assert lengths[0] < budget < lengths[-1], lengths


def test_prompts_cover_chunked_prefill(smol_reference):
    prompts, _ = smol_reference
    assert_some_prefill_is_chunked(prompts, CHUNK_BUDGET)


def test_smollm2_batch_with_chunked_prefill(smol_folder, smol_reference):
    prompts, expected = smol_reference
    llm = LLM(
        str(smol_folder), dtype="float32", max_model_len=512, max_num_batched_tokens=CHUNK_BUDGET
    )
    assert run_batch(llm, prompts) == expected
    assert_all_blocks_free(llm.engine)


def test_smollm2_on_the_torch_path_without_native_kernels(smol_folder, smol_reference):
    """The fallback for machines without a compiler: same tokens, with no native kernel
    (a mixed batch, two of its prefills chunked)."""
    prompts, expected = subset(smol_reference, TORCH_PATH_PROMPTS)
    assert_some_prefill_is_chunked(prompts, CHUNK_BUDGET)
    cpu_build.use_torch_path()
    try:
        llm = LLM(
            str(smol_folder),
            dtype="float32",
            max_model_len=512,
            max_num_batched_tokens=CHUNK_BUDGET,
        )
        assert type(llm.engine.executor.worker.runner.attention).__name__ == "TorchAttention"
        assert run_batch(llm, prompts) == expected
    finally:
        cpu_build.use_torch_path(False)


def test_smollm2_batch_with_preemption(smol_folder, smol_reference):
    """Four prompts (37 to 162 tokens, 32 blocks once answered) in a pool of 20 blocks."""
    prompts, expected = subset(smol_reference, PREEMPTION_PROMPTS)
    block_bytes = 2 * 16 * 3 * 64 * 4 * 30  # K+V, block of 16, 3 KV heads of 64, fp32, 30 layers
    llm = LLM(
        str(smol_folder),
        dtype="float32",
        max_model_len=256,
        max_num_batched_tokens=128,
        kv_cache_memory=20 * block_bytes,
    )
    assert run_batch(llm, prompts) == expected
    assert llm.engine.stats().num_preemptions > 0
    assert_all_blocks_free(llm.engine)


# llama3 in blocks of 128 tokens (vLLM's CPU default): chunks and preemptions mid-block.
@pytest.mark.parametrize(("name", "block_size", "blocks"), [("qwen2", 16, 30), ("llama3", 128, 4)])
def test_tiny_models_match_hf(name, block_size, blocks, tiny_folder, smol_tokenizer):
    from transformers import AutoModelForCausalLM

    folder = tiny_folder(name)
    hf_model = AutoModelForCausalLM.from_pretrained(folder, dtype="float32").eval()
    prompts = mixed_prompts(smol_tokenizer)
    expected = [hf_greedy(hf_model, prompt, MAX_NEW_TOKENS) for prompt in prompts]
    block_bytes = bytes_per_block(ModelConfig.from_folder(folder), block_size, torch.float32)
    llm = LLM(
        str(folder),
        dtype="float32",
        max_model_len=384,
        max_num_batched_tokens=48,
        block_size=block_size,
        kv_cache_memory=blocks * block_bytes,
    )
    assert run_batch(llm, prompts) == expected
    assert llm.engine.stats().num_preemptions > 0
    assert_all_blocks_free(llm.engine)
