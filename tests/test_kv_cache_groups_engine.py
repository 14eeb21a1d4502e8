"""KV cache groups end to end: a Gemma-2-shaped tiny model (sliding window 16 and full
attention, alternating over four layers) keeps one block table per group over one pool,
its two groups sharing two cache tensors. A batch whose contexts need more blocks than
the pool has, were every block kept, runs without preemption because the sliding group
frees the blocks behind its window (filled with NaN the moment they are freed: nothing
reads them again), and equals transformers' greedy tokens; so do forks, speculative
proposals and a prefix hit over both groups."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from architecture_check import check_prompts, write_tiny_checkpoint
from octavo import LLM, SamplingParams
from octavo.kv_cache.group_coordinator import KVCacheCoordinator
from octavo.kv_cache.kv_cache_groups import SLIDING
from test_sliding_window_blocks import poison_freed_blocks

from conftest import assert_all_blocks_free, hf_greedy

WINDOW, BLOCK, NEW_TOKENS, USABLE = 16, 16, 40, 16
GEMMA2 = {
    "num_hidden_layers": 4,
    "tie_word_embeddings": False,
    "sliding_window": WINDOW,
    "layer_types": ["sliding_attention", "full_attention"] * 2,
    "query_pre_attn_scalar": 24,
    "attn_logit_softcapping": 4.0,
    "final_logit_softcapping": 8.0,
}


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory, smol_tokenizer) -> tuple[Path, list[list[int]], list[list[int]]]:
    from transformers import AutoModelForCausalLM

    folder = write_tiny_checkpoint(
        tmp_path_factory.mktemp("gemma2_groups"), "gemma2", smol_tokenizer, **GEMMA2
    )
    prompts = check_prompts(smol_tokenizer)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    expected = [hf_greedy(model, prompt, NEW_TOKENS, ignore_eos=True) for prompt in prompts]
    return folder, prompts, expected


def held_blocks(kv: KVCacheCoordinator) -> list[int]:
    """Real blocks each group's tables hold now."""
    null = kv.pool.null_block
    return [
        sum(block is not null for table in m.tables.values() for block in table.blocks)
        for m in kv.managers
    ]


def record_peaks(kv: KVCacheCoordinator) -> list[int]:
    """Each group's peak of held blocks, updated after every allocation."""
    peaks = [0] * len(kv.managers)
    allocate = kv.allocate_slots

    def allocate_and_record(*args, **kwargs) -> bool:
        done = allocate(*args, **kwargs)
        peaks[:] = map(max, peaks, held_blocks(kv))
        return done

    kv.allocate_slots = allocate_and_record
    return peaks


def small_pool_llm(folder: Path, caching: bool, usable: int = USABLE, **extra) -> LLM:
    """``usable`` blocks of two layers each (the group size: two cache tensors)."""
    layer_bytes = BLOCK * 2 * 2 * 16 * 4  # keys and values, 2 KV heads of 16, fp32
    return LLM(
        str(folder),
        dtype="float32",
        block_size=BLOCK,
        max_num_batched_tokens=48,
        max_model_len=160,
        kv_cache_memory=(usable + 1) * 2 * layer_bytes,
        enable_prefix_caching=caching,
        **extra,
    )


def test_the_sliding_group_frees_blocks_so_a_batch_larger_than_the_pool_runs(gemma2):
    folder, prompts, expected = gemma2
    prompts, expected = prompts[:3], expected[:3]
    per_group = [-(-(len(p) + NEW_TOKENS) // BLOCK) for p in prompts]
    assert 2 * sum(per_group) > USABLE, "the pool was meant to be too small without freeing"
    with small_pool_llm(folder, caching=False) as llm:
        kv = llm.engine.kv
        assert isinstance(kv, KVCacheCoordinator) and kv.pool.num_usable_blocks == USABLE
        assert [g.kind.kind for g in kv.groups.groups] == [SLIDING, "full"]
        caches = llm.engine.parts.executor.worker.runner.kv_caches
        assert caches[0] is caches[1] and caches[2] is caches[3] and caches[0] is not caches[2]
        poison_freed_blocks(llm)
        peaks = record_peaks(kv)
        greedy = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
        outputs = llm.generate(prompts, greedy, use_tqdm=False)
        assert [out.outputs[0].token_ids for out in outputs] == expected
        assert llm.engine.stats().num_preemptions == 0
        sliding_peak, full_peak = peaks
        live = -(-(WINDOW - 1 + 48) // BLOCK) + 1  # the window and one step, per sequence
        assert sliding_peak <= 3 * live < sum(per_group)  # kept whole: a block per 16 tokens
        assert sliding_peak < full_peak <= sum(per_group)
        assert_all_blocks_free(llm.engine)


def test_forks_proposals_and_a_prefix_hit_over_both_groups_equal_transformers(gemma2):
    """n=2 forks with ngram proposals (rejected ones included), then a prompt whose
    prefix is cached in both groups (a pool large enough that the sliding group's blocks
    freed behind its window are not reused before): every completion equals HF's."""
    folder, prompts, expected = gemma2
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    params = SamplingParams(n=2, temperature=0.0, max_tokens=16, ignore_eos=True)
    with small_pool_llm(folder, caching=True, usable=40, speculative_config=ngram) as llm:
        for index in (2, 3):  # the second one's prefix is the first one's, cached
            (out,) = llm.generate(prompts[index : index + 1], params, use_tqdm=False)
            assert [c.token_ids for c in out.outputs] == [expected[index][:16]] * 2
        stats = llm.engine.stats()
        assert stats.prefix_cache_hits > 0
        assert stats.spec_decode.num_draft_tokens > 0  # proposals verified (and rejected)
        assert_all_blocks_free(llm.engine)
