"""Freeing KV blocks behind a uniform sliding window (vLLM's ``SlidingWindowManager``).

When every layer slides with window ``W``, the query at position ``i`` sees keys
``i - W < j <= i``: once a sequence has ``c`` computed tokens, blocks holding only
positions ``<= c - W`` are dead. The manager frees them as the sequence advances and
nulls their table entries; the attention backends never read there (the torch path, the
native CPU kernel and the Triton kernels start at the window), which the poisoned-cache
tests check by filling freed blocks with NaN.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
import torch

from architecture_check import check_prompts, write_tiny_checkpoint
from octavo import LLM, SamplingParams
from octavo.attention.backend import TorchAttention
from octavo.attention.cpu_native import NativeCpuAttention
from octavo.attention.kv_quant import UNIT_SCALES
from octavo.attention.options import AttentionOptions
from octavo.kernels import cpu_build
from octavo.kv_cache.block_pool import NULL_BLOCK_ID, BlockPool
from octavo.kv_cache.cache_tensors import bytes_per_block
from octavo.kv_cache.kv_cache_manager import KVCacheManager
from octavo.kv_cache.sliding_window import max_blocks_per_sequence, num_skipped_blocks
from octavo.model_executor.model_config import ModelConfig
from test_attention_options import (
    FP32_TOLERANCE,
    SEQUENCES,
    assert_close,
    build_step,
    step_reference,
)

from conftest import assert_all_blocks_free, hf_greedy

BLOCK, WINDOW = 4, 6


def manager(num_blocks: int = 40, window: int | None = WINDOW, caching: bool = True):
    return KVCacheManager(BlockPool(num_blocks, caching), BLOCK, window)


def run_prompt(kv: KVCacheManager, seq_id: int, tokens: list[int]) -> None:
    """Allocate and "compute" a whole prompt in one step, registering its full blocks."""
    assert kv.allocate_slots(seq_id, 0, len(tokens))
    kv.cache_full_blocks(seq_id, tokens, len(tokens))


def decode(kv: KVCacheManager, seq_id: int, tokens: list[int], new_token: int) -> None:
    """One decode step after ``tokens`` (all computed): room for one more, then compute it."""
    assert kv.allocate_slots(seq_id, len(tokens), 1)
    tokens.append(new_token)
    kv.cache_full_blocks(seq_id, tokens, len(tokens))


# ----- the block arithmetic -----------------------------------------------------------------
def test_blocks_are_skipped_exactly_when_no_future_query_sees_them():
    # Next query at 8 sees 3..8 (block 0 holds 0..3: alive); at 9 it sees 4..9 (block 0 dead).
    assert num_skipped_blocks(8, WINDOW, BLOCK) == 0
    assert num_skipped_blocks(9, WINDOW, BLOCK) == 1
    assert num_skipped_blocks(12, WINDOW, BLOCK) == 1
    assert num_skipped_blocks(13, WINDOW, BLOCK) == 2
    assert num_skipped_blocks(1000, None, BLOCK) == 0
    assert num_skipped_blocks(3, 1, BLOCK) == 0 and num_skipped_blocks(4, 1, BLOCK) == 1


def test_a_sequence_never_holds_more_blocks_than_the_capacity_bound():
    """Random chunk sizes and windows: live blocks never exceed ``max_blocks_per_sequence``."""
    rng = random.Random(0)
    for _ in range(200):
        window, step = rng.randint(1, 20), rng.randint(1, 9)
        kv, computed, total = manager(200, window, caching=False), 0, rng.randint(1, 150)
        bound = max_blocks_per_sequence(total, BLOCK, window, step)
        while computed < total:
            num_new = min(rng.randint(1, step), total - computed)
            assert kv.allocate_slots(0, computed, num_new)
            held = sum(1 for block_id in kv.block_ids(0) if block_id != NULL_BLOCK_ID)
            assert held <= bound, (window, step, computed, num_new)
            computed += num_new
        kv.free(0)
        assert kv.pool.num_free_blocks == kv.pool.num_usable_blocks
    assert max_blocks_per_sequence(1000, 16, None, 48) == 63
    assert max_blocks_per_sequence(1000, 16, 24, 48) == 6  # ceil(71 / 16) + 1
    assert max_blocks_per_sequence(40, 16, 24, 48) == 3  # never more than the whole context


# ----- the manager --------------------------------------------------------------------------
def test_decoding_frees_the_block_behind_the_window_at_the_right_step():
    kv = manager()
    tokens = list(range(100, 108))  # 8 tokens: blocks 0 and 1 full
    run_prompt(kv, 0, tokens)
    first = kv.block_ids(0)[0]
    free_before = kv.pool.num_free_blocks
    decode(kv, 0, tokens, 200)  # allocation at 8 computed: the query at 8 sees 3..8
    assert kv.block_ids(0)[0] == first and kv.pool.num_free_blocks == free_before - 1
    decode(kv, 0, tokens, 201)  # allocation at 9 computed: block 0 (positions 0..3) is dead
    assert kv.block_ids(0)[0] == NULL_BLOCK_ID
    assert kv.pool.blocks[first].ref_count == 0
    assert kv.pool.num_free_blocks == free_before  # block 2 allocated, block 0 freed
    for token in range(202, 205):  # allocations at 10, 11, 12: block 1 (4..7) still seen
        decode(kv, 0, tokens, token)
    assert kv.block_ids(0)[1] != NULL_BLOCK_ID
    decode(kv, 0, tokens, 205)  # at 13 the query sees 8..13: block 1 is dead
    assert kv.block_ids(0)[:2] == [NULL_BLOCK_ID, NULL_BLOCK_ID]
    assert len(kv.block_ids(0)) == 4
    assert kv.num_tokens_held(0, 14) == 6  # positions 8..13, in blocks 2 and 3
    kv.free(0)
    assert kv.pool.num_free_blocks == kv.pool.num_usable_blocks
    assert all(block.ref_count == 0 for block in kv.pool.blocks)


def test_without_a_window_nothing_is_freed_while_running():
    kv = manager(window=None)
    tokens = list(range(30))
    run_prompt(kv, 0, tokens)
    for token in range(10):
        decode(kv, 0, tokens, token)
    assert NULL_BLOCK_ID not in kv.block_ids(0)
    assert len(kv.block_ids(0)) == 10


def test_chunked_prefill_frees_behind_each_chunk():
    kv = manager(caching=False)
    tokens = list(range(40))
    for start in range(0, 40, 8):  # chunks of 8: allocation at 0, 8, 16, 24, 32 computed
        assert kv.allocate_slots(0, start, 8)
        nulls = kv.block_ids(0).count(NULL_BLOCK_ID)
        assert nulls == num_skipped_blocks(start, WINDOW, BLOCK)
        kv.cache_full_blocks(0, tokens, start + 8)
    assert len(kv.block_ids(0)) == 10
    assert kv.pool.usage() == pytest.approx(4 / 39)  # the chunk at 32 sees 27..: blocks 6..9
    kv.free(0)
    assert kv.pool.usage() == 0.0


def test_a_freed_block_stays_cached_for_prefix_hits():
    """The freed block keeps its hash on the free list; a later request with the same
    prefix revives it, and the hits behind its own window are not revived."""
    kv = manager()
    tokens = list(range(100, 116))  # four full blocks
    run_prompt(kv, 0, tokens)
    original = [kv.pool.blocks[block_id] for block_id in kv.block_ids(0)]
    for token in range(5):
        decode(kv, 0, tokens, token)  # 20 tokens: blocks 0..2 freed (dead from 15 computed)
    assert kv.block_ids(0)[:3] == [NULL_BLOCK_ID] * 3
    assert [block.ref_count for block in original] == [0, 0, 0, 1]
    assert all(block.block_hash is not None for block in original)  # still cached
    free_before = kv.pool.num_free_blocks
    hits = kv.find_cached_prefix([*tokens[:16], 7, 7, 7])
    assert len(hits) == 4 and hits[2:] == original[2:]
    assert kv.allocate_slots(1, 16, 3, hits)  # 16 computed: blocks 0..1 are behind the window
    assert kv.block_ids(1) == [
        NULL_BLOCK_ID,
        NULL_BLOCK_ID,
        original[2].block_id,
        original[3].block_id,
        kv.block_ids(1)[4],
    ]
    assert [block.ref_count for block in original] == [0, 0, 1, 2]
    assert kv.pool.num_free_blocks == free_before - 2  # block 2 revived, one new block
    kv.free(0)
    kv.free(1)
    assert kv.pool.num_free_blocks == kv.pool.num_usable_blocks


def test_a_hit_needs_only_the_blocks_inside_the_window():
    """Evicted blocks behind the window do not cut the hit short (vLLM's sliding-window
    hit); without a window the first evicted block ends it."""
    for window, expected in ((WINDOW, 6), (None, 0)):
        kv = manager(window=window)
        tokens = list(range(100, 124))  # six full blocks; a 25th token is left to compute
        run_prompt(kv, 0, tokens)
        blocks = [kv.pool.blocks[block_id] for block_id in kv.block_ids(0)]
        kv.free(0)
        kv.pool.touch(blocks[2:])  # kept aside while every other free block is reused
        evicted = kv.pool.allocate(kv.pool.num_free_blocks)  # blocks 0 and 1 lose their hash
        kv.pool.free(blocks[2:])
        hits = kv.find_cached_prefix([*tokens, 5])
        assert len(hits) == expected
        if window is not None:  # 24 computed: the next query sees 19..24, blocks 4 and 5
            assert hits[:4] == [kv.pool.null_block] * 4 and hits[4:] == blocks[4:]
            assert kv.allocate_slots(1, 24, 1, hits)
            assert kv.block_ids(1)[:4] == [NULL_BLOCK_ID] * 4
            assert blocks[3].ref_count == 0  # behind the window: not revived
            assert blocks[4].ref_count == blocks[5].ref_count == 1
            kv.cache_full_blocks(1, [*tokens, 5], 25)  # chains on from the hits' hashes
            kv.free(1)
        kv.pool.free(evicted)
        assert kv.pool.num_free_blocks == kv.pool.num_usable_blocks


def test_forked_sequences_release_shared_blocks_independently():
    kv = manager(caching=False)
    tokens = list(range(10))
    run_prompt(kv, 0, tokens)
    kv.fork(0, 1, 10)
    shared = kv.pool.blocks[kv.block_ids(0)[0]]
    assert shared.ref_count == 2
    child = list(tokens)
    decode(kv, 0, tokens, 1)  # the parent frees its reference (copy-on-write of block 2 too)
    assert kv.block_ids(0)[0] == NULL_BLOCK_ID and shared.ref_count == 1
    decode(kv, 1, child, 2)
    assert kv.block_ids(1)[0] == NULL_BLOCK_ID and shared.ref_count == 0
    assert kv.block_ids(0)[2] != kv.block_ids(1)[2]  # the partly filled block was copied
    kv.free(0)
    kv.free(1)
    assert kv.pool.num_free_blocks == kv.pool.num_usable_blocks


def test_preempting_a_sequence_with_freed_blocks_frees_each_block_once():
    kv = manager(caching=False)
    tokens = list(range(30))
    run_prompt(kv, 0, tokens)
    decode(kv, 0, tokens, 1)
    assert kv.block_ids(0).count(NULL_BLOCK_ID) == 6
    kv.free(0)  # what preemption does
    assert kv.pool.num_free_blocks == kv.pool.num_usable_blocks
    run_prompt(kv, 0, tokens)  # recomputed from scratch
    assert NULL_BLOCK_ID not in kv.block_ids(0)
    kv.free(0)


def test_a_short_pool_runs_a_long_sequence_only_with_a_window():
    """Eight usable blocks (32 tokens) decode 200 tokens with a window of 6; without
    one the allocation fails once the pool is spent."""
    for window, expect_room in ((WINDOW, True), (None, False)):
        kv = manager(9, window, caching=False)
        ok = all(kv.allocate_slots(0, computed, 1) for computed in range(200))
        assert ok is expect_room
        kv.free(0)


def test_speculative_slots_of_rejected_tokens_are_not_freed_early():
    """Verification of k proposals allocates ahead; only kept tokens count as computed,
    so the freeing follows the kept length, never the proposals."""
    kv = manager(caching=False)
    assert kv.allocate_slots(0, 0, 8)
    assert kv.allocate_slots(0, 8, 5)  # last token + 4 proposals: positions 8..12
    assert kv.block_ids(0)[0] != NULL_BLOCK_ID  # 8 computed: block 0 still visible
    assert kv.allocate_slots(0, 9, 5)  # one kept (9 computed): block 0 dead now
    assert kv.block_ids(0)[0] == NULL_BLOCK_ID and len(kv.block_ids(0)) == 4
    kv.free(0)
    assert kv.pool.num_free_blocks == kv.pool.num_usable_blocks


def test_a_window_below_one_is_refused():
    with pytest.raises(ValueError, match="sliding_window must be at least 1"):
        manager(window=0)


# ----- the backends never read a freed block ------------------------------------------------
POISON_SHAPES = [(4, 2, 64, 16), (3, 3, 64, 8)]  # heads, kv_heads, head_dim, block_size
POISON_WINDOWS = [1, 5, 21]  # inside a block, and across block edges


def poisoned_step(shape, window: int):
    """A mixed step (prompts, a chunk over a cached prefix, decodes) whose blocks behind the
    window are freed as the manager frees them: NaN in the cache, null in the table."""
    step, block_size = build_step(shape, SEQUENCES, torch.float32), shape[3]
    freed = 0
    for row, (context, query_len) in enumerate(SEQUENCES):
        dead = num_skipped_blocks(context - query_len, window, block_size)
        for index in range(dead):
            step.cache[:, int(step.meta.block_tables[row, index])] = float("nan")
            step.meta.block_tables[row, index] = NULL_BLOCK_ID
        freed += dead
    assert freed > 0
    return step


@pytest.fixture(scope="module")
def native_ops():
    kernels = cpu_build.cpu_ops()
    if kernels is None and shutil.which("c++"):
        pytest.fail(f"a C++ compiler is here but no kernels: {cpu_build.unavailable_reason()}")
    if kernels is None:
        pytest.skip(reason=f"no C++ compiler, no native kernels: {cpu_build.unavailable_reason()}")
    return kernels


@pytest.mark.parametrize("shape", POISON_SHAPES)
@pytest.mark.parametrize("window", POISON_WINDOWS)
def test_torch_and_native_backends_never_read_freed_blocks(native_ops, shape, window):
    options, scale = AttentionOptions(sliding_window=window), shape[2] ** -0.5
    for backend in (TorchAttention(), NativeCpuAttention(native_ops)):
        step = poisoned_step(shape, window)
        out = backend.forward(
            step.query, step.key, step.value, step.cache, step.meta, scale, UNIT_SCALES, options
        )
        assert not out.isnan().any(), type(backend).__name__
        assert_close(out, step_reference(step, SEQUENCES, scale, options), FP32_TOLERANCE)


# ----- an engine: a tiny Mistral whose every layer slides -----------------------------------
ENGINE_WINDOW, ENGINE_BLOCK, NEW_TOKENS = 24, 16, 40


@pytest.fixture(scope="module")
def mistral(tmp_path_factory, smol_tokenizer) -> tuple[Path, list[list[int]], list[list[int]]]:
    """The checkpoint, four prompts (~6 to ~90 tokens, two sharing a prefix) and HF's
    greedy continuations of each."""
    from transformers import AutoModelForCausalLM

    folder = write_tiny_checkpoint(
        tmp_path_factory.mktemp("mistral_window"),
        "mistral",
        smol_tokenizer,
        architectures=["MistralForCausalLM"],
        sliding_window=ENGINE_WINDOW,
    )
    prompts = check_prompts(smol_tokenizer)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    expected = [hf_greedy(model, prompt, NEW_TOKENS, ignore_eos=True) for prompt in prompts]
    return folder, prompts, expected


def small_pool_llm(folder: Path, usable_blocks: int, caching: bool, **extra) -> LLM:
    block_bytes = bytes_per_block(ModelConfig.from_folder(folder), ENGINE_BLOCK, torch.float32)
    return LLM(
        str(folder),
        dtype="float32",
        max_num_batched_tokens=48,
        block_size=ENGINE_BLOCK,
        kv_cache_memory=(usable_blocks + 1) * block_bytes,
        enable_prefix_caching=caching,
        **extra,
    )


def poison_freed_blocks(llm: LLM) -> None:
    """Fill every block with NaN the moment its last reference goes (prefix caching off:
    nothing may read a free block again)."""
    pool, caches = llm.engine.parts.pool, llm.engine.parts.executor.worker.runner.kv_caches
    release = pool.free

    def free_and_poison(blocks):
        release(blocks)
        for block in blocks:
            if block.ref_count == 0:
                for cache in caches:
                    cache[:, block.block_id] = float("nan")

    pool.free = free_and_poison


GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)


def test_mistral_runs_a_batch_larger_than_the_pool_equal_to_transformers(mistral):
    """16 usable blocks, fewer than the batch's contexts need (and than max_model_len
    1024): with blocks freed behind the window nothing is preempted, every freed block is
    NaN, and the output equals HF's."""
    folder, prompts, expected = mistral
    usable = 16
    whole = sum(-(-(len(p) + NEW_TOKENS) // ENGINE_BLOCK) for p in prompts[:3])
    assert whole > usable, "the pool was meant to be too small without freeing"
    with small_pool_llm(folder, usable, caching=False) as llm:
        assert llm.engine.max_model_len == 1024
        poison_freed_blocks(llm)
        outputs = llm.generate(prompts[:3], GREEDY, use_tqdm=False)
        assert [out.outputs[0].token_ids for out in outputs] == expected[:3]
        assert llm.engine.stats().num_preemptions == 0
        assert_all_blocks_free(llm.engine)


def test_mistral_with_prefix_hits_and_preemption_equals_transformers(mistral):
    """A pool so small that the batch preempts, and a second request whose shared prefix
    hits blocks the first one freed behind its window (still cached)."""
    folder, prompts, expected = mistral
    with small_pool_llm(folder, 8, caching=True) as llm:
        outputs = llm.generate(prompts[:3], GREEDY, use_tqdm=False)
        outputs += llm.generate(prompts[3:], GREEDY, use_tqdm=False)
        stats = llm.engine.stats()
        assert [out.outputs[0].token_ids for out in outputs] == expected
        assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
        assert_all_blocks_free(llm.engine)


def test_mistral_speculating_and_forking_equals_transformers(mistral):
    """ngram proposals (rejected ones included) and n=2 forks over freed blocks: every
    completion equals HF's greedy one."""
    folder, prompts, expected = mistral
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    params = SamplingParams(n=2, temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    with small_pool_llm(folder, 10, caching=True, speculative_config=ngram) as llm:
        outputs = llm.generate(prompts[1:3], params, use_tqdm=False)
        for out, want in zip(outputs, expected[1:3], strict=True):
            assert [c.token_ids for c in out.outputs] == [want, want]
        counters = llm.engine.stats().spec_decode
        assert 0 < counters.num_accepted_tokens < counters.num_draft_tokens  # some rejected
        assert_all_blocks_free(llm.engine)
