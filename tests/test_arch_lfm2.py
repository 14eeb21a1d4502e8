"""LFM2 (``Lfm2ForCausalLM``): short-convolution state layers beside QK-norm attention
layers. A tiny random checkpoint written by transformers is greedy fp32 token-identical
to HF ``generate`` through ``LLM(folder)`` with chunked prefill (48-token steps cut the
long prompts) and forced preemption (a pool of 11 KV blocks); on the same engine, forks
decode from a copy of their parent's convolution state: ``n = 3`` greedy completions are
all HF's (without the copy the forks drift from the fifth token on), ``n = 3`` seeded
ones equal three single requests carrying the forks' seeds; and on two tensor-parallel
ranks (channels split). The GPU's memory-profile step runs through its state layers (on
the null slot). Prefix caching is off for it: its states are not kept per block, and
speculative decoding is refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from architecture_check import (
    NEW_TOKENS,
    check_prompts,
    hf_reference,
    octavo_greedy,
    write_tiny_checkpoint,
)
from octavo import LLM, SamplingParams
from octavo.kv_cache.cache_tensors import bytes_per_block
from octavo.scheduler.sequence import sequence_seed
from octavo.worker.memory_profile import CacheSpec, DummyStep, measure_step_peak

CONFIG = {
    "num_hidden_layers": 3,
    "layer_types": ["conv", "full_attention", "conv"],
    "conv_L_cache": 3,
    "conv_bias": True,
    "norm_eps": 1e-5,
    "block_ffn_dim_multiplier": 1.5,  # 2/3 of 96, times 1.5, rounded up to 32: 96
    "block_multiple_of": 32,
}
HIDDEN, KERNEL, MAX_NUM_SEQS, BLOCKS = 64, 3, 8, 11


def kv_cache_memory(ranks: int = 1) -> int:
    """Per rank: the conv layers' slots (max_num_seqs + the null slot), then 11 blocks of
    the attention layer."""
    states = (MAX_NUM_SEQS + 1) * 2 * (HIDDEN // ranks) * (KERNEL - 1) * 4
    shape = type("Shape", (), {"num_layers": 1, "num_kv_heads": 2 // ranks, "head_dim": 16})
    return states + BLOCKS * bytes_per_block(shape, 16, torch.float32)


@pytest.fixture(scope="module")
def folder(tmp_path_factory, smol_tokenizer) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("lfm2"), "lfm2", smol_tokenizer, **CONFIG)


@pytest.fixture(scope="module")
def expected(folder, smol_tokenizer) -> list[list[int]]:
    return hf_reference(folder, check_prompts(smol_tokenizer))


def forks_follow_the_parent_state(prompt: list[int], greedy: list[int]):
    """On the engine: three completions of one prompt (two forked after its prefill),
    greedy ones all ``greedy``, seeded ones as three requests seeded as the forks are."""

    def check(llm: LLM) -> None:
        runner = llm.engine.executor.worker.runner
        conv_state = runner.kv_caches[0][0]
        assert conv_state.shape == (MAX_NUM_SEQS + 1, HIDDEN, KERNEL - 1)
        assert runner.kv_caches[1].shape[1] == BLOCKS  # the attention layer's blocks
        params = SamplingParams(n=3, temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
        (same,) = llm.generate([prompt], params, use_tqdm=False)
        assert [c.token_ids for c in same.outputs] == [greedy] * 3
        base = {"temperature": 0.5, "max_tokens": 8, "ignore_eos": True}
        forked = llm.generate([prompt], SamplingParams(n=3, seed=11, **base), use_tqdm=False)
        alone = [SamplingParams(seed=sequence_seed(11, i), **base) for i in range(3)]
        singles = llm.generate([prompt] * 3, alone, use_tqdm=False)
        got = sorted(tuple(c.token_ids) for c in forked[0].outputs)
        assert got == sorted(tuple(out.outputs[0].token_ids) for out in singles)
        assert len(set(got)) > 1, "the seeds were meant to sample different completions"
        assert llm.engine.kv.state_slots.num_free == MAX_NUM_SEQS  # every slot back

    return check


def the_memory_profile_step_runs(llm: LLM) -> None:
    """The GPU's sizing step (run on CPU here): a dummy prefill through a scratch cache
    whose state layers have only the null slot, every dummy sequence writing it."""
    worker = llm.engine.executor.worker
    cache = CacheSpec(16, torch.float32, torch.device("cpu"))
    step = DummyStep([20, 5], logits_rows=2)
    peak = measure_step_peak(worker.paged_model_on, worker.cache_shape, step, cache)
    assert peak is None  # a CPU keeps no allocator statistics: the step ran, that is all


def test_greedy_matches_hf_with_chunks_preemption_and_forks(folder, expected, smol_tokenizer):
    prompts = check_prompts(smol_tokenizer)
    forks = forks_follow_the_parent_state(prompts[0], expected[0])

    def then(llm: LLM) -> None:
        forks(llm)
        the_memory_profile_step_runs(llm)

    got, stats = octavo_greedy(
        folder, prompts, then, kv_cache_memory=kv_cache_memory(), max_num_seqs=MAX_NUM_SEQS
    )
    for index, (mine, theirs) in enumerate(zip(got, expected, strict=True)):
        assert mine == theirs, f"prompt {index}: octavo {mine} != transformers {theirs}"
    assert stats.num_preemptions > 0, "the KV pool was meant to force preemption"
    assert stats.prefix_cache_hits == 0, "prefix caching is off for state layers"


def test_tensor_parallel_2_matches_hf(folder, expected, smol_tokenizer):
    """Conv channels and heads split over two ranks: the short and the long prompt."""
    prompts = check_prompts(smol_tokenizer)[:2]
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    args = {"dtype": "float32", "max_model_len": 160, "max_num_batched_tokens": 48}
    args.update(tensor_parallel_size=2, kv_cache_memory=kv_cache_memory(2), max_num_seqs=8)
    with LLM(str(folder), **args) as llm:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [out.outputs[0].token_ids for out in outputs] == expected[:2]


def test_speculative_decoding_is_refused_in_one_line(folder):
    """A state cannot take back rejected proposals: refused before any worker starts."""
    ngram = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}
    with pytest.raises(ValueError, match="speculative decoding is not supported for Lfm2"):
        LLM(str(folder), dtype="float32", speculative_config=ngram)
