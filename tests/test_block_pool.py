"""The block pool and per-sequence block tables, without a model."""

from __future__ import annotations

from octavo.kv_cache.block_pool import BlockPool
from octavo.kv_cache.free_block_queue import FreeBlockQueue, KVBlock
from octavo.kv_cache.kv_cache_manager import KVCacheManager

BLOCK = 4


def test_free_queue_is_fifo_with_removal_from_the_middle():
    blocks = [KVBlock(i) for i in range(4)]
    queue = FreeBlockQueue(blocks)
    queue.remove(blocks[1])
    queue.appendleft(blocks[1])
    assert [b.block_id for b in queue] == [1, 0, 2, 3]
    assert queue.popleft() is blocks[1]
    assert queue.size == 3


def test_allocate_returns_none_when_short_and_null_block_is_never_handed_out():
    pool = BlockPool(5)
    got = pool.allocate(4)
    assert got is not None and 0 not in [b.block_id for b in got]
    assert pool.allocate(1) is None
    pool.free(got)
    assert pool.num_free_blocks == 4 and pool.usage() == 0.0


def test_cached_blocks_are_revived_by_touch_and_evicted_lru():
    pool = BlockPool(4)
    first, second, third = pool.allocate(3)
    pool.register(first, 11, (1, 2))
    pool.register(second, 22, (3, 4))
    pool.free([second, first, third])  # tail first, as sequences free them
    assert pool.lookup(11, (1, 2)) is first
    assert pool.lookup(11, (9, 9)) is None  # token ids are checked, not just the hash
    pool.touch([first])
    assert first.ref_count == 1 and pool.num_free_blocks == 2
    (reused,) = pool.allocate(1)  # the uncached block goes first
    assert reused is third
    (evicted,) = pool.allocate(1)  # then the least recently freed cached one
    assert evicted is second and pool.lookup(22, (3, 4)) is None


def test_prefix_hits_skip_the_last_token_and_chain_hashes():
    pool = BlockPool(16)
    kv = KVCacheManager(pool, BLOCK)
    tokens = list(range(12))
    assert kv.allocate_slots(1, 0, 12)
    kv.cache_full_blocks(1, tokens, 12)
    assert len(kv.find_cached_prefix(tokens)) == 2  # capped at len - 1: third block recomputed
    assert len(kv.find_cached_prefix([*tokens, 99])) == 3
    assert kv.find_cached_prefix([0, 1, 2, 7, *tokens[4:]]) == []  # chain broken at block 0


def test_fork_shares_blocks_and_copies_the_partial_last_block_on_write():
    pool = BlockPool(16)
    kv = KVCacheManager(pool, BLOCK)
    assert kv.allocate_slots(1, 0, 6)  # 1.5 blocks
    kv.fork(1, 2, 6)
    assert kv.block_ids(1) == kv.block_ids(2)
    assert kv.allocate_slots(2, 6, 1)  # child writes into the shared partial block
    copies = kv.take_pending_copies()
    assert len(copies) == 1 and copies[0][0] == kv.block_ids(1)[1]
    assert kv.block_ids(2)[0] == kv.block_ids(1)[0]
    assert kv.block_ids(2)[1] == copies[0][1]
    kv.free(1)
    kv.free(2)
    assert pool.num_free_blocks == pool.num_usable_blocks
    assert all(block.ref_count == 0 for block in pool.blocks)


def test_fork_leaves_the_blocks_kept_ahead_to_the_parent_and_copies_a_shared_middle_block():
    pool = BlockPool(16)
    kv = KVCacheManager(pool, BLOCK)
    assert kv.allocate_slots(1, 0, 6 + 2 * BLOCK)  # 6 tokens + slots kept ahead (a draft's)
    kv.fork(1, 2, 6)
    assert kv.block_ids(2) == kv.block_ids(1)[:2]
    assert kv.allocate_slots(1, 6, 3)  # the parent writes into block 1, shared, not its last
    ((source, copy),) = kv.take_pending_copies()
    assert source == kv.block_ids(2)[1] and kv.block_ids(1)[1] == copy
    kv.free(1)
    kv.free(2)
    assert pool.num_free_blocks == pool.num_usable_blocks


def test_failed_allocation_changes_nothing():
    pool = BlockPool(3)
    kv = KVCacheManager(pool, BLOCK)
    assert not kv.allocate_slots(1, 0, 3 * BLOCK)
    assert pool.num_free_blocks == 2 and not kv.tables
