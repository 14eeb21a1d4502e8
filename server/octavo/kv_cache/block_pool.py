"""The block pool: ref counts, a free list, and the prefix-cache map from hash to block.

Block 0 is the null block: never handed out, it pads block tables. A freed block keeps
its hash until it is reused, so a later request with the same prefix can revive it
("touch"). Allocation never blocks or raises for lack of space: it returns None and the
scheduler decides whom to preempt.

With ``record_events`` the pool also records KV cache events for ``--kv-events-config``
(vLLM's): the kv cache manager adds ``BlockStored`` for what it registers, the pool
``BlockRemoved`` when a cached hash is dropped (its block reused) and ``AllBlocksCleared``
when the whole prefix cache is reset; the engine takes them once a step. Off, ``events``
is None and nothing is recorded. The hashes announced are always those of ``cached``.

With an offload tier (``offload``, ``--kv-offloading-size``) a cached block about to be
reused is first handed to the tier, which saves its keys/values (``offload_tier``).
"""

from __future__ import annotations

from octavo.kv_cache.block_hash import BlockHash
from octavo.kv_cache.free_block_queue import FreeBlockQueue, KVBlock
from octavo.kv_cache.offload_tier import OffloadTier, TierCopy
from octavo.kv_events.events import (
    MEDIUM_CPU,
    AllBlocksCleared,
    BlockRemoved,
    KVCacheEvent,
    wire_hash,
)

NULL_BLOCK_ID = 0


class BlockPool:
    def __init__(
        self, num_blocks: int, enable_prefix_caching: bool = True, record_events: bool = False
    ) -> None:
        if num_blocks < 2:
            raise ValueError(f"the KV cache needs at least 2 blocks, got {num_blocks}")
        self.blocks = [KVBlock(block_id=i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks[1:])
        self.enable_prefix_caching = enable_prefix_caching
        self.cached: dict[BlockHash, KVBlock] = {}
        self.events: list[KVCacheEvent] | None = [] if record_events else None
        self.offload: OffloadTier | None = None  # the host tier evicted blocks go to

    def attach_offload(
        self, num_slots: int, block_size: int, bytes_per_block: int, medium: str = MEDIUM_CPU
    ) -> None:
        """Save evicted cached blocks to a host tier of ``num_slots`` blocks."""
        self.offload = OffloadTier(num_slots, block_size, bytes_per_block, self.events, medium)

    def take_tier_copies(self) -> list[TierCopy]:
        """The step's copies to and from the offload tier, in order (none without one)."""
        return [] if self.offload is None else self.offload.take_copies()

    @property
    def null_block(self) -> KVBlock:
        """The placeholder of table entries whose block was freed (never allocated)."""
        return self.blocks[NULL_BLOCK_ID]

    @property
    def num_usable_blocks(self) -> int:
        return len(self.blocks) - 1

    @property
    def num_free_blocks(self) -> int:
        return self.free_queue.size

    def usage(self) -> float:
        """Fraction of usable blocks held by sequences (vLLM's kv_cache_usage_perc)."""
        return 1.0 - self.num_free_blocks / self.num_usable_blocks

    def allocate(self, count: int) -> list[KVBlock] | None:
        if count > self.free_queue.size:
            return None
        blocks = [self.free_queue.popleft() for _ in range(count)]
        if self.offload is not None:
            self._offload_cached(blocks)
        removed = [self._forget_hash(block) for block in blocks]
        for block in blocks:
            block.ref_count = 1
        self._record_removed(removed)
        return blocks

    def _offload_cached(self, blocks: list[KVBlock]) -> None:
        """Save the cached blocks among ``blocks`` (about to be written over) to the tier."""
        assert self.offload is not None
        for block in blocks:
            block_hash = block.block_hash
            if block_hash is not None and self.cached.get(block_hash) is block:
                assert block.token_ids is not None
                self.offload.save(block_hash, block.token_ids, block.parent_hash, block.block_id)

    def lookup(self, block_hash: BlockHash, token_ids: tuple[int, ...]) -> KVBlock | None:
        block = self.cached.get(block_hash)
        if block is None or block.token_ids != token_ids:
            return None
        return block

    def touch(self, blocks: list[KVBlock]) -> None:
        """Take a reference on cache hits, reviving free ones off the free list."""
        for block in blocks:
            if block.ref_count == 0:
                self.free_queue.remove(block)
            block.ref_count += 1

    def free(self, blocks: list[KVBlock]) -> None:
        """Drop one reference each. Pass blocks tail first: the tail of a chain is evicted first."""
        for block in blocks:
            block.ref_count -= 1
            assert block.ref_count >= 0, f"block {block.block_id} freed twice"
            if block.ref_count == 0:
                self._release(block)

    def _release(self, block: KVBlock) -> None:
        if block.block_hash is None:
            self.free_queue.appendleft(block)  # nothing worth keeping: reuse first
        else:
            self.free_queue.append(block)  # cached: keep as long as possible (LRU)

    def register(
        self,
        block: KVBlock,
        block_hash: BlockHash,
        token_ids: tuple[int, ...],
        parent: BlockHash | None = None,
    ) -> bool:
        """Mark a full, computed block as reusable by later requests with the same prefix
        (``parent``: the hash of the block before it); True if its hash is newly cached."""
        if not self.enable_prefix_caching or block.block_hash is not None:
            return False
        if block_hash in self.cached:  # an equal block already exists; keep tables append-only
            return False
        block.block_hash, block.token_ids, block.parent_hash = block_hash, token_ids, parent
        self.cached[block_hash] = block
        return True

    def _forget_hash(self, block: KVBlock) -> BlockHash | None:
        """Drop the block's hash; the hash if it was the cached one (it leaves the cache)."""
        block_hash = block.block_hash
        if block_hash is None:
            return None
        block.block_hash = block.token_ids = block.parent_hash = None
        if self.cached.get(block_hash) is not block:
            return None
        del self.cached[block_hash]
        return block_hash

    def _record_removed(self, hashes: list[BlockHash | None]) -> None:
        if self.events is not None and any(h is not None for h in hashes):
            self.events.append(BlockRemoved([wire_hash(h) for h in hashes if h is not None]))

    def reset_prefix_cache(self) -> None:
        """Forget the hashes of free blocks. With no block in use that is the whole
        cache (vLLM resets only then, publishing ``AllBlocksCleared``); otherwise the
        blocks in use keep theirs and the others are reported removed."""
        removed = [self._forget_hash(block) for block in self.free_queue]
        if self.offload is not None:
            self.offload.clear()
        if self.events is not None and self.num_free_blocks == self.num_usable_blocks:
            self.events.append(AllBlocksCleared())
        else:
            self._record_removed(removed)

    def take_events(self) -> list[KVCacheEvent]:
        """The events recorded since the last call (none when not recording)."""
        if not self.events:
            return []
        events, self.events = self.events, []
        return events
