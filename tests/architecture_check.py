"""The check every architecture passes: a tiny random checkpoint written by transformers,
loaded by Octavo from the folder, greedy fp32 output token-identical to HF ``generate``.

One engine run covers chunked prefill (a step budget smaller than the longest prompt),
forced preemption (a KV pool smaller than the batch needs) and prefix-cache hits (two
prompts share a long prefix, the second submitted after the first finished). The
sliding window of a checkpoint is smaller than the long prompts, so windows are crossed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import torch

from octavo import LLM, SamplingParams
from octavo.engine.kv_groups import kv_cache_groups_for
from octavo.kv_cache.cache_tensors import bytes_per_block
from octavo.kv_cache.kv_cache_groups import blocks_per_sequence
from octavo.model_executor.model_config import ModelConfig
from octavo.model_executor.piecewise_graphs import PiecewiseGraphs, cuts_cleanly
from piecewise_tapes import TapeSegments

from conftest import assert_all_blocks_free, hf_greedy

NEW_TOKENS = 12
TINY_SIZES = {  # small enough for seconds-long runs on two cores
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 1024,
}


def write_tiny_checkpoint(folder: Path, model_type: str, tokenizer, **config) -> Path:
    """transformers' own random model of ``model_type`` (seeded, weights widened so argmaxes
    do not tie), saved with the tokenizer into ``folder``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    raw = {**TINY_SIZES, "vocab_size": len(tokenizer), **config}
    raw["bos_token_id"], raw["eos_token_id"] = tokenizer.bos_token_id, tokenizer.eos_token_id
    hf_config = AutoConfig.for_model(model_type, **raw)
    torch.manual_seed(1234)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.2)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def check_prompts(tokenizer) -> list[list[int]]:
    """Four prompts: short, long (chunked, window-crossing) and two sharing a long prefix."""
    shared = "Explain the scheduler of a serving engine, step by step, in detail. " * 6
    texts = [
        "Tell me about the moon.",
        "Please explain PagedAttention in detail. " * 12,
        shared + "First question: why blocks?",
        shared + "Second question: why chunks?",
    ]
    return [tokenizer.encode(text) for text in texts]


def hf_reference(folder: Path, prompts: list[list[int]]) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return [hf_greedy(model, prompt, NEW_TOKENS, ignore_eos=True) for prompt in prompts]


def octavo_greedy(
    folder: Path,
    prompts: list[list[int]],
    then: Callable[[LLM], None] | None = None,
    **engine_args,
) -> tuple[list, object]:
    """Octavo's greedy tokens: the first three prompts as one batch, the fourth after them
    (so its shared prefix is a cache hit); the engine's stats after both runs. ``then``:
    a further check on the same engine, run last (saves a test an engine start)."""
    config = ModelConfig.from_folder(folder)
    ranks = engine_args.get("tensor_parallel_size", 1)  # each rank holds its KV heads' share
    rank_config = dataclasses.replace(config, num_kv_heads=max(1, config.num_kv_heads // ranks))
    block_bytes, blocks = preempting_pool(config, rank_config)
    args = {
        "dtype": "float32",
        "max_model_len": 160,
        "max_num_batched_tokens": 48,
        "kv_cache_memory": blocks * block_bytes,
        "enable_prefix_caching": True,
        **engine_args,
    }
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    with LLM(str(folder), **args) as llm:
        pieces = None
        if ranks == 1 and engine_args.get("pipeline_parallel_size", 1) == 1:
            # A GPU's start-up kernel warm-up (``kernel_warm_up``), run here on the CPU: its
            # dummy steps pass every layer, and what they leave in the cache changes nothing
            assert llm.engine.executor.worker.warm_up_kernels() > 0
            pieces = cut_at_attention(llm, args["max_num_batched_tokens"], args["max_model_len"])
        outputs = llm.generate(prompts[:3], params, use_tqdm=False)  # eager mixed steps
        if pieces is not None:  # the fourth prompt's steps through the pieces
            llm.engine.executor.worker.runner.piecewise = pieces
        outputs += llm.generate(prompts[3:], params, use_tqdm=False)
        stats = llm.engine.stats()
        if engine_args.get("tensor_parallel_size", 1) == 1:
            assert_all_blocks_free(llm.engine)
        if then is not None:
            then(llm)
    return [out.outputs[0].token_ids for out in outputs], stats


def cut_at_attention(llm: LLM, max_tokens: int, max_model_len: int) -> PiecewiseGraphs | None:
    """A GPU's piecewise graphs (``piecewise_graphs``) as CPU tapes, recorded at start-up
    like a GPU's, for a model that can be cut at attention (None for one that cannot)."""
    runner = llm.engine.executor.worker.runner
    if cuts_cleanly(runner.paged) is not None:
        return None
    pieces = PiecewiseGraphs(runner.paged, [8, max_tokens], max_model_len, TapeSegments())
    if pieces.capture():
        return pieces
    # The CPU's MoE routes on the host (a tape cannot replay it; a GPU's is on the device)
    assert "depends on tensor values on the host" in str(pieces.refusal), pieces.refusal
    return None


def preempting_pool(config: ModelConfig, rank_config: ModelConfig) -> tuple[int, int]:
    """(bytes a block takes, blocks) of a pool the first batch (~210 tokens) overflows:
    160 tokens, fewer where blocks behind a window every layer shares are freed; with KV
    cache groups (each block one group's layers), one 160-token sequence's blocks over
    every group and the null block."""
    groups = kv_cache_groups_for(config, 1, has_draft=False, has_states=False)
    if groups is None:
        blocks = 9 if config.uniform_sliding_window else 11
        return bytes_per_block(rank_config, 16, torch.float32), blocks
    group_config = dataclasses.replace(rank_config, num_layers=groups.group_size)
    blocks = blocks_per_sequence(groups, 160, 16, max_step_tokens=48) + 1
    return bytes_per_block(group_config, 16, torch.float32), blocks


def assert_matches_hf(
    folder: Path,
    tokenizer,
    expected: list[list[int]] | None = None,
    then: Callable[[LLM], None] | None = None,
    **engine_args,
) -> None:
    """Greedy token identity with HF, with preemption and a prefix-cache hit seen;
    ``expected``: ``hf_reference`` of ``check_prompts``, where a test computed it already."""
    prompts = check_prompts(tokenizer)
    if expected is None:
        expected = hf_reference(folder, prompts)
    got, stats = octavo_greedy(folder, prompts, then, **engine_args)
    for index, (mine, theirs) in enumerate(zip(got, expected, strict=True)):
        assert mine == theirs, f"prompt {index}: octavo {mine} != transformers {theirs}"
    assert stats.num_preemptions > 0, "the KV pool was meant to force preemption"
    assert stats.prefix_cache_hits > 0, "the shared prefix was meant to hit the cache"
