"""Prefix-cache hits in the KV offload tier: pool blocks for them, and their loads.

``load_from_tier`` continues a sequence's prefix lookup where the pool misses: the
consecutive blocks after the pool's hits that the tier holds get fresh pool blocks,
registered under their hashes (so the lookup made again finds them as ordinary hits),
and one ``TierCopy`` load each, which the workers make before the step's forward pass.

The pool's own hits are held while the new blocks are taken, so taking them cannot
evict the prefix being rebuilt; the tier entries are touched first so the saves that
taking them causes drop other entries, and each entry is looked up again afterwards (a
tiny tier may still lose one: the load stops there and the rest is recomputed).
Used for a manager without a window (the builder refuses the tier otherwise).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from octavo.kv_cache.block_hash import BlockHash

if TYPE_CHECKING:
    from octavo.kv_cache.kv_cache_manager import KVCacheManager, PrefixLookup


def load_from_tier(manager: KVCacheManager, lookup: PrefixLookup, token_ids: list[int]) -> bool:
    """Load the tier's blocks that extend the pool's hits in ``lookup``; True if any."""
    pool, tier, size = manager.pool, manager.pool.offload, manager.block_size
    assert tier is not None
    start = next((i for i, block in enumerate(lookup.found) if block is None), None)
    if start is None:
        return False  # the pool holds the whole prefix
    tier.counters.queries += (len(lookup.found) - start) * size
    keys = _tier_run(manager, lookup, token_ids, start)
    if not keys:
        return False
    hits = lookup.found[:start]
    pool.touch(hits)  # type: ignore[arg-type]
    count = min(len(keys), pool.num_free_blocks)
    blocks = pool.allocate(count) or []
    loaded = 0
    for block, key in zip(blocks, keys, strict=False):
        chunk = _chunk(token_ids, start + loaded, size)
        if tier.lookup(key, chunk) is None:
            break  # dropped by the saves the allocation made (a tier smaller than a step)
        parent = lookup.hashes[start + loaded - 1] if start + loaded else None
        pool.register(block, key, chunk, None if parent is None else manager.tier_key(parent))
        tier.load(key, block.block_id)
        loaded += 1
    tier.counters.hits += loaded * size
    pool.free(list(reversed(hits + blocks)))  # type: ignore[operator]
    return loaded > 0


def _tier_run(
    manager: KVCacheManager, lookup: PrefixLookup, token_ids: list[int], start: int
) -> list[BlockHash]:
    """The pool keys of the consecutive blocks from ``start`` the tier holds (touched)."""
    tier, size = manager.pool.offload, manager.block_size
    assert tier is not None
    keys = []
    for index in range(start, len(lookup.found)):
        key = manager.tier_key(lookup.hashes[index])
        entry = tier.lookup(key, _chunk(token_ids, index, size))
        if entry is None:
            break
        tier.entries.move_to_end(key)
        keys.append(key)
    return keys


def _chunk(token_ids: list[int], index: int, size: int) -> tuple[int, ...]:
    return tuple(token_ids[index * size : (index + 1) * size])
