"""The KV offload tier (--kv-offloading-size): evicted prefix-cache blocks saved to host
memory and loaded back on a later hit, with greedy output unchanged."""

from __future__ import annotations

import pytest

from octavo import LLM, SamplingParams
from octavo.kv_cache.block_pool import BlockPool
from octavo.kv_events.events import BlockRemoved, BlockStored

from conftest import assert_all_blocks_free, hf_greedy

BLOCK_BYTES = 4096  # llama3 tiny: 2 planes x 16 tokens x 1 head x 16 dims x 4 bytes x 2 layers
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
LONG = [100 + (7 * i) % 900 for i in range(70)]  # 4 full blocks looked up, 5 held
OTHER = [50 + (11 * i) % 900 for i in range(120)]  # 8 blocks: evicts LONG's


def _engine(folder, **kwargs) -> LLM:
    return LLM(
        str(folder),
        device="cpu",
        dtype="float32",
        max_model_len=144,
        kv_cache_memory=10 * BLOCK_BYTES,  # 9 usable blocks
        **kwargs,
    )


def _run(llm: LLM, prompts: list[list[int]]) -> list:
    return [llm.generate({"prompt_token_ids": p}, GREEDY, use_tqdm=False)[0] for p in prompts]


@pytest.fixture(scope="module")
def runs(tiny_folder):
    folder = tiny_folder("llama3")
    tiered = _engine(folder, kv_offloading_size=64 * BLOCK_BYTES / (1 << 30))
    plain = _engine(folder)
    results = {
        "tiered": _run(tiered, [LONG, OTHER, LONG]),
        "plain": _run(plain, [LONG, OTHER, LONG]),
    }
    yield folder, tiered, results
    tiered.shutdown()
    plain.shutdown()


def test_an_evicted_prompt_is_loaded_back_from_the_tier_with_the_same_output(runs):
    _, tiered, results = runs
    first, _, again = results["tiered"]
    assert again.num_cached_tokens == 64  # every looked-up block: the pool's and the tier's
    assert results["plain"][2].num_cached_tokens < 64  # without the tier: recomputed
    counters = tiered.engine.stats().kv_offload
    assert counters.loaded_blocks >= 1 and counters.hits == 16 * counters.loaded_blocks
    assert counters.stored_blocks >= counters.loaded_blocks
    tokens = [r.outputs[0].token_ids for r in results["tiered"]]
    assert tokens == [r.outputs[0].token_ids for r in results["plain"]]
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    assert_all_blocks_free(tiered.engine)


def test_the_tiered_output_equals_hf(runs):
    from transformers import AutoModelForCausalLM

    folder, _, results = runs
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype="float32").eval()
    assert list(results["tiered"][2].outputs[0].token_ids) == hf_greedy(hf, LONG, 8, True)


def test_the_tier_announces_cpu_blocks_and_drops_its_least_recently_used():
    pool = BlockPool(4, record_events=True)
    pool.attach_offload(num_slots=2, block_size=16, bytes_per_block=BLOCK_BYTES)
    blocks = pool.allocate(3)
    for index, block in enumerate(blocks):
        pool.register(block, bytes([index]) * 32, (index,) * 16)
    pool.free(blocks)
    pool.take_events()
    pool.allocate(3)  # every cached block reused: all three saved, the first dropped
    copies = pool.take_tier_copies()
    assert [(c.to_tier, c.block_id) for c in copies] == [(True, 1), (True, 2), (True, 3)]
    assert copies[2].slot == copies[0].slot  # the LRU entry's slot is reused
    assert set(pool.offload.entries) == {bytes([1]) * 32, bytes([2]) * 32}
    cpu = [e for e in pool.take_events() if getattr(e, "medium", None) == "CPU"]
    assert [type(e) for e in cpu] == [BlockStored, BlockStored, BlockRemoved, BlockStored]


def test_bad_offload_settings_are_refused(tiny_folder):
    with pytest.raises(ValueError, match="kv_offloading_backend"):
        _engine(tiny_folder("llama3"), kv_offloading_size=1.0, kv_offloading_backend="lmcache")
    with pytest.raises(ValueError, match="prefix caching is off"):
        _engine(tiny_folder("llama3"), kv_offloading_size=1.0, enable_prefix_caching=False)


def test_metrics_name_the_tiers_bytes_by_direction(runs):
    from octavo.entrypoints.openai.kv_offload_metrics import offload_metrics

    _, tiered, _ = runs
    counters = tiered.engine.stats().kv_offload
    samples = {
        (s.name, s.labels.get("transfer_type")): s.value
        for metric in offload_metrics(counters, "tiny", 0.0)
        for s in metric.samples
        if s.name.endswith("_total")
    }
    loaded = counters.loaded_blocks * BLOCK_BYTES
    assert samples[("vllm:kv_offload_total_bytes_total", "CPU_to_GPU")] == loaded
    assert samples[("vllm:external_prefix_cache_hits_total", None)] == counters.hits


def test_a_cpu_tier_is_an_unlinked_file_mapping(runs):
    import os

    _, tiered, _ = runs
    tier = tiered.engine.executor.worker.runner.offload
    filename = tier.tensors[0].untyped_storage().filename
    assert filename is not None and "kv-tier-" in filename
    assert not os.path.exists(filename)  # unlinked once mapped: nothing left after a crash
    assert {t.untyped_storage().filename for t in tier.tensors} == {filename}
    assert tier.tensors[0].untyped_storage().nbytes() >= 64 * BLOCK_BYTES
    assert tiered.engine.parts.pool.offload.medium == "STORAGE"  # vLLM's fs tier's events
