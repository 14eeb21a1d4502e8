"""One block manager per KV cache group over one shared block pool (vLLM's hybrid
``KVCacheCoordinator``).

Each group (``kv_cache_groups``) keeps its own per-sequence block table; a sliding or
chunked group frees the blocks behind its window or chunk, a full group keeps them all.
The scheduler sees one budget: a step's allocation succeeds in every group or in none,
and freeing a sequence (finished or preempted) frees it in every group. A prefix-cache
hit must hold in every group at once: the coordinator takes the longest prefix whose
blocks each group has (a full group needs every block, a sliding one only its window's).
Copy-on-write copies and KV events come from every group; block ids are the pool's, so
the runner copies them in every cache tensor as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from octavo.kv_cache.block_hash import BlockHasher, HashChain
from octavo.kv_cache.block_pool import BlockPool
from octavo.kv_cache.free_block_queue import KVBlock
from octavo.kv_cache.kv_cache_groups import KVCacheGroups
from octavo.kv_cache.kv_cache_manager import CacheHits, KVCacheManager

if TYPE_CHECKING:
    from octavo.lora_request import LoRARequest


class GroupHits(list):
    """A prefix hit in every group: as a list, the first group's blocks (so its length
    counts the cached blocks, as a plain manager's hits); ``per_group`` each group's."""

    def __init__(self, per_group: list[CacheHits]) -> None:
        super().__init__(per_group[0])
        self.per_group = per_group


class KVCacheCoordinator:
    """The ``KVCacheManager`` interface the scheduler uses, over several groups."""

    def __init__(
        self,
        pool: BlockPool,
        block_size: int,
        groups: KVCacheGroups,
        hasher: BlockHasher | None = None,
    ) -> None:
        hasher = hasher or BlockHasher.create()
        self.pool, self.block_size, self.groups, self.hasher = pool, block_size, groups, hasher
        self.managers = [
            KVCacheManager(
                pool,
                block_size,
                group.kind.sliding_window,
                hasher,
                chunk_size=group.kind.chunk_size,
                group_tag=bytes([index]) if index else b"",
            )
            for index, group in enumerate(groups.groups)
        ]
        self.state_slots = None  # state-layer models keep one group (``KVCacheManager``)

    @property
    def tables(self) -> dict:
        """The sequences holding blocks (the first group's tables, as a manager's)."""
        return self.managers[0].tables

    def block_ids(self, seq_id: int) -> list[int]:
        """The first group's table (the scheduler's ``block_ids``)."""
        return self.managers[0].block_ids(seq_id)

    def group_block_ids(self, seq_id: int) -> tuple[list[int], ...]:
        """Each group's block table as ids (shared lists: never mutate them)."""
        return tuple(manager.block_ids(seq_id) for manager in self.managers)

    def num_tokens_held(self, seq_id: int, num_computed: int) -> int:
        """The most computed tokens any group still holds (a full group's: all)."""
        return max(manager.num_tokens_held(seq_id, num_computed) for manager in self.managers)

    def find_cached_prefix(self, token_ids: list[int], chain: HashChain | None = None) -> list:
        """The longest prefix of full blocks every group holds (its window's, for a
        sliding group), one ``CacheHits`` per group; [] for none."""
        if not self.pool.enable_prefix_caching:
            return []
        chain = chain or HashChain()
        pairs = [(manager, manager.lookup_prefix(token_ids, chain)) for manager in self.managers]
        for end in range(len(pairs[0][1].found), 0, -1):
            hits = [manager.hits_at(lookup, end) for manager, lookup in pairs]
            if all(hit is not None for hit in hits):
                return GroupHits(hits)  # type: ignore[arg-type]
        return []

    def allocate_slots(
        self, seq_id: int, num_computed: int, num_new: int, cached: list[KVBlock] = ()
    ) -> bool:
        """Room for ``num_new`` tokens in every group, or in none (False: the pool is
        short). Every group takes its cache hits before any allocates new blocks."""
        per_group = cached.per_group if isinstance(cached, GroupHits) else [()] * len(self)
        pairs = list(zip(self.managers, per_group, strict=True))
        needed = sum(m.blocks_needed(seq_id, num_computed, num_new, c) for m, c in pairs)
        if needed > self.pool.num_free_blocks:
            return False
        for manager, hits in pairs:
            manager.take_hits(seq_id, num_computed, hits)
        for manager in self.managers:
            manager.allocate_new(seq_id, num_computed, num_new)
        return True

    def fork(self, parent_id: int, child_id: int, num_computed: int) -> None:
        for manager in self.managers:
            manager.fork(parent_id, child_id, num_computed)

    def cache_full_blocks(
        self,
        seq_id: int,
        token_ids: list[int],
        num_computed: int,
        chain: HashChain | None = None,
        lora: LoRARequest | None = None,
    ) -> None:
        for manager in self.managers:
            manager.cache_full_blocks(seq_id, token_ids, num_computed, chain, lora)

    def free(self, seq_id: int) -> None:
        for manager in self.managers:
            manager.free(seq_id)

    def take_pending_copies(self) -> list[tuple[int, int]]:
        return [copy for manager in self.managers for copy in manager.take_pending_copies()]

    def state_slot(self, seq_id: int) -> int:
        return 0  # the null slot: no state layers

    def take_state_copies(self) -> list[tuple[int, int]]:
        return []

    def __len__(self) -> int:
        return len(self.managers)
