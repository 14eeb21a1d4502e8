"""KV cache groups (vLLM's hybrid KV cache manager): layers grouped by layout, one block
table per group over one shared pool, allocation in every group or none, sliding and
chunked groups freeing the blocks behind them, preemption, forks and prefix hits across
groups."""

from __future__ import annotations

import torch

from octavo.kv_cache.block_pool import BlockPool
from octavo.kv_cache.group_coordinator import GroupHits, KVCacheCoordinator
from octavo.kv_cache.kv_cache_groups import CHUNKED, FULL, SLIDING, KVLayerKind, group_layers
from octavo.kv_events.events import BlockStored
from octavo.model_executor.group_tables import add_group_tables
from octavo.model_executor.kv_layer_kinds import kv_layer_kinds
from octavo.model_executor.model_config import ModelConfig
from octavo.model_executor.step_inputs import lay_out, step_inputs
from octavo.scheduler.output import ScheduledSequence

BLOCK, WINDOW = 4, 6
FULL_KIND, SLIDE = KVLayerKind(FULL), KVLayerKind(SLIDING, WINDOW)


def config(layer_types: list[str], **extra) -> ModelConfig:
    raw = {
        "architectures": ["Gemma2ForCausalLM"],
        "model_type": "gemma2",
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": len(layer_types),
        "num_attention_heads": 2,
        "vocab_size": 64,
        "sliding_window": 128,
        "layer_types": layer_types,
    }
    return ModelConfig.from_dict(raw | extra)


def test_gemma2_alternating_layers_make_two_groups_sharing_their_tensors() -> None:
    kinds = kv_layer_kinds(config(["sliding_attention", "full_attention"] * 3))
    groups = group_layers(kinds)
    assert [g.kind for g in groups.groups] == [KVLayerKind(SLIDING, 128), FULL_KIND]
    assert [g.layers for g in groups.groups] == [(0, 2, 4), (1, 3, 5)]
    assert groups.group_size == 3  # three tensors, each holding one layer of each group
    assert [groups.tensor_of(layer) for layer in range(6)] == [0, 0, 1, 1, 2, 2]


def test_gemma3_five_to_one_makes_groups_of_the_rarest_kinds_count() -> None:
    types = (["sliding_attention"] * 5 + ["full_attention"]) * 2
    groups = group_layers(kv_layer_kinds(config(types)))
    assert groups.group_size == 2
    assert [g.layers for g in groups.groups] == [(0, 1), (2, 3), (4, 6), (7, 8), (9, 10), (5, 11)]
    assert groups.layer_groups(12) == [0, 0, 1, 1, 2, 5, 2, 3, 3, 4, 4, 5]


def test_gpt_oss_and_llama4_layouts() -> None:
    gpt_oss = group_layers([KVLayerKind(SLIDING, 128), FULL_KIND] * 2)
    assert gpt_oss.group_size == 2 and len(gpt_oss.groups) == 2
    types = ["chunked_attention"] * 3 + ["full_attention"]
    llama4 = config(types * 2, attention_chunk_size=8192)
    groups = group_layers(kv_layer_kinds(llama4))
    assert [g.kind for g in groups.groups] == [KVLayerKind(CHUNKED, 8192)] * 3 + [FULL_KIND]
    assert [g.layers for g in groups.groups] == [(0, 1), (2, 4), (5, 6), (3, 7)]


def test_uniform_and_nearly_even_layouts_pad_to_one_group_size() -> None:
    assert group_layers([SLIDE] * 4).is_uniform
    uneven = group_layers([SLIDE] * 6 + [FULL_KIND] * 5)  # 6 < 5 * 1.25: pad the full group
    assert uneven.group_size == 6 and [len(g.layers) for g in uneven.groups] == [6, 5]
    assert group_layers([None, FULL_KIND, None, FULL_KIND]).layer_groups(4) == [None, 0, None, 0]


def coordinator(num_blocks: int = 40, caching: bool = True) -> KVCacheCoordinator:
    groups = group_layers([SLIDE, FULL_KIND])
    return KVCacheCoordinator(BlockPool(num_blocks, caching), BLOCK, groups)


def run(kv: KVCacheCoordinator, seq_id: int, tokens: list[int], computed: int = 0) -> None:
    assert kv.allocate_slots(seq_id, computed, len(tokens) - computed)
    kv.cache_full_blocks(seq_id, tokens, len(tokens))


def test_the_sliding_group_frees_behind_its_window_the_full_group_keeps_all() -> None:
    kv = coordinator()
    tokens = list(range(20))
    run(kv, 1, tokens)
    run(kv, 1, [*tokens, 99], computed=20)  # next token 20 sees 15..20: blocks 0-2 dead
    sliding, full = kv.group_block_ids(1)
    assert sliding[:3] == [0, 0, 0] and 0 not in sliding[3:] and len(sliding) == 6
    assert 0 not in full and len(full) == 6
    assert not set(sliding[3:]) & set(full)  # one pool, distinct blocks
    assert kv.pool.num_free_blocks == 39 - 3 - 6


def test_chunked_group_frees_the_chunks_before_the_current_one() -> None:
    groups = group_layers([KVLayerKind(CHUNKED, 8), FULL_KIND])
    kv = KVCacheCoordinator(BlockPool(40), BLOCK, groups)
    run(kv, 1, list(range(17)))
    assert kv.allocate_slots(1, 17, 1)
    chunked, full = kv.group_block_ids(1)
    assert chunked[:4] == [0] * 4 and 0 not in chunked[4:]  # chunk 2 starts at 16
    assert 0 not in full


def test_allocation_is_all_or_none_and_preemption_frees_every_group() -> None:
    kv = coordinator(num_blocks=10)  # 9 usable: 5 + 5 blocks for 20 tokens do not fit
    assert not kv.allocate_slots(1, 0, 20)
    assert kv.pool.num_free_blocks == 9 and not kv.tables
    assert kv.allocate_slots(1, 0, 16)  # 4 + 4
    assert not kv.allocate_slots(2, 0, 4)  # 2 more blocks, one left: neither group takes it
    assert kv.pool.num_free_blocks == 1 and 2 not in kv.managers[1].tables
    kv.free(1)  # preempted
    assert kv.pool.num_free_blocks == 9


def test_fork_shares_and_copies_on_write_in_every_group() -> None:
    kv = coordinator()
    run(kv, 1, list(range(6)))
    kv.fork(1, 2, 6)
    assert kv.group_block_ids(2) == kv.group_block_ids(1)
    assert kv.allocate_slots(2, 6, 1)
    copies = kv.take_pending_copies()
    assert len(copies) == 2  # the shared, partly filled block of each group
    assert [src for src, _ in copies] == [ids[1] for ids in kv.group_block_ids(1)]
    kv.free(1)
    kv.free(2)
    assert kv.pool.num_free_blocks == 39


def test_a_prefix_hit_holds_in_every_group() -> None:
    kv = coordinator()
    prompt = list(range(21))
    run(kv, 1, prompt)
    kv.free(1)
    hits = kv.find_cached_prefix(prompt)
    assert isinstance(hits, GroupHits) and len(hits) == 5  # 20 tokens: a token left to compute
    sliding, full = hits.per_group
    assert sliding[:3] == [kv.pool.null_block] * 3  # behind the window of token 20
    assert kv.pool.null_block not in full
    assert kv.allocate_slots(2, 20, 1, hits)
    assert kv.group_block_ids(2)[1][:5] == [block.block_id for block in full]


def test_the_hit_is_cut_where_one_group_lost_its_block() -> None:
    kv = coordinator()
    prompt = list(range(21))
    run(kv, 1, prompt)
    kv.free(1)
    lost = kv.managers[1].lookup_prefix(prompt).found[2]
    kv.pool._forget_hash(lost)  # the full group's third block is no longer cached
    hits = kv.find_cached_prefix(prompt)
    assert len(hits) == 2 and all(len(group) == 2 for group in hits.per_group)


def test_no_prefix_caching_no_hits() -> None:
    kv = coordinator(caching=False)
    run(kv, 1, list(range(9)))
    assert kv.find_cached_prefix(list(range(9))) == []


def test_every_group_announces_its_blocks_under_its_own_hashes() -> None:
    groups = group_layers([SLIDE, FULL_KIND])
    kv = KVCacheCoordinator(BlockPool(40, record_events=True), BLOCK, groups)
    run(kv, 1, list(range(9)))
    stored = [event for event in kv.pool.take_events() if isinstance(event, BlockStored)]
    assert len(stored) == 2  # one run of two full blocks per group
    first, second = (set(event.block_hashes) for event in stored)
    assert len(first) == len(second) == 2 and not first & second


def test_every_group_takes_its_hits_before_any_allocates() -> None:
    """A hit that sits free in the pool is revived before another group's new blocks
    are taken from the free list (which would reuse it)."""
    kv = coordinator(num_blocks=11)  # 10 usable
    prompt = list(range(9))
    run(kv, 1, prompt)  # 3 + 3 blocks, two full in each group cached
    kv.free(1)
    hits = kv.find_cached_prefix(prompt)
    assert len(hits) == 2
    queue = kv.pool.free_queue
    for block in hits.per_group[1]:  # the full group's hits first in line for reuse
        queue.remove(block)
        queue.appendleft(block)
    assert kv.allocate_slots(2, 8, 9, hits)  # 17 tokens: 3 new blocks a group, 6 of 10 free
    held = [block for m in kv.managers for block in m.tables[2].blocks]
    assert len({block.block_id for block in held}) == len(held) == 10
    assert kv.group_block_ids(2)[1][:2] == [block.block_id for block in hits.per_group[1]]


def test_each_layer_reads_its_groups_block_table_and_slots() -> None:
    decode = ScheduledSequence(
        seq_id=1,
        token_ids=[7],
        num_computed_tokens=9,
        block_ids=[1, 2, 3],
        sample=True,
        group_block_ids=([0, 2, 3], [4, 5, 6]),  # the sliding group freed its first block
    )
    meta = step_inputs(lay_out([decode], BLOCK), 0, torch.device("cpu")).meta
    add_group_tables(meta, [decode], [0, 1, 0], BLOCK, torch.device("cpu"))
    sliding, full, again = meta.layer_metas
    assert sliding is again and sliding is not full
    assert sliding.block_tables.tolist() == [[0, 2, 3]]
    assert full.block_tables.tolist() == [[4, 5, 6]]
    assert sliding.slot_mapping.tolist() == [3 * BLOCK + 1] and full.slot_mapping.tolist() == [25]
    assert sliding.seq_lens is meta.seq_lens and sliding.backend_cache is not meta.backend_cache
