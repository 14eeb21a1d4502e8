"""``allocate_slots``' fast path (the held blocks already cover the new slots) must leave
the cache exactly as the general path does, on the same random operations."""

from __future__ import annotations

import random

from octavo.kv_cache.block_pool import BlockPool
from octavo.kv_cache.kv_cache_manager import KVCacheManager

BLOCK = 4


class GeneralPathOnly(KVCacheManager):
    """The manager as it was before the fast path: every call takes the general path."""

    def allocate_slots(self, seq_id, num_computed, num_new, cached=()):  # type: ignore[override]
        return self._allocate_slots(seq_id, num_computed, num_new, cached)


def _state(kv: KVCacheManager) -> tuple:
    tables = {seq_id: kv.block_ids(seq_id) for seq_id in sorted(kv.tables)}
    return tables, kv.pool.num_free_blocks, list(kv.pending_copies)


def _random_operations(seed: int, kv: KVCacheManager) -> list[tuple]:
    """Allocations (decode-sized and prefill-sized, some kept ahead), forks that share a
    partly filled block, frees and registrations; each call's result is recorded."""
    rng, computed, log = random.Random(seed), {}, []
    for step in range(400):
        op = rng.random()
        if op < 0.1 or not computed:
            computed[step] = 0  # a new sequence
        seq_id = rng.choice(sorted(computed))
        if op < 0.15 and computed[seq_id] > 0:
            kv.fork(seq_id, 1000 + step, computed[seq_id])
            computed[1000 + step] = computed[seq_id]
        elif op < 0.22:
            kv.free(seq_id)
            del computed[seq_id]
        else:
            num_new = rng.choice([0, 1, 1, 1, 2, 3, 7])
            ahead = rng.choice([0, 0, 2])  # lookahead slots, computed on a later step
            ok = kv.allocate_slots(seq_id, computed[seq_id], num_new + ahead)
            computed[seq_id] += num_new if ok else 0
            log.append((step, seq_id, ok))
        log.append(_state(kv))
    return log


def test_fast_path_leaves_the_same_tables_free_blocks_and_copies_as_the_general_path():
    for seed in range(6):
        fast = KVCacheManager(BlockPool(40), BLOCK)
        general = GeneralPathOnly(BlockPool(40), BLOCK)
        assert _random_operations(seed, fast) == _random_operations(seed, general)


def test_fast_path_takes_no_block_while_the_last_one_has_room():
    kv = KVCacheManager(BlockPool(8), BLOCK)
    assert kv.allocate_slots(0, 0, 3)
    free = kv.pool.num_free_blocks
    assert kv.allocate_slots(0, 3, 1) and kv.pool.num_free_blocks == free
    assert kv.allocate_slots(0, 4, 1) and kv.pool.num_free_blocks == free - 1


def test_block_ids_are_shared_until_the_blocks_change_and_never_mutated():
    kv = KVCacheManager(BlockPool(8), BLOCK)
    assert kv.allocate_slots(0, 0, 4)
    before = kv.block_ids(0)
    assert kv.allocate_slots(0, 3, 1) and kv.block_ids(0) is before  # no new block
    assert kv.allocate_slots(0, 4, 1)
    assert len(before) == 1 and len(kv.block_ids(0)) == 2  # the step's copy kept its table
