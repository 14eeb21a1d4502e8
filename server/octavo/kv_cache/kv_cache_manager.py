"""Per-sequence block tables on top of the block pool.

A sequence's table grows on demand as its tokens are scheduled. Full blocks of computed
tokens are hashed (SHA-256 chained with the previous block's hash, the adapter and the
request's cache salt: see ``block_hash``) and registered for prefix caching.
Sequences forked for ``n > 1`` share the prompt's blocks; the first write into a
shared, partly filled block copies it (copy-on-write) and the copy is recorded for the
model runner to perform before the step's forward pass.

When every layer slides with one window (``sliding_window``), the leading blocks no future
query of a sequence can see are freed as it advances (see ``sliding_window``): their table
entries become the null block, which the attention backends never read (they start at the
window). A freed block keeps its prefix-cache hash in the pool's free list, so another
request with the same prefix can still revive it until it is reused.

One manager may also serve one group of a hybrid model's layers (``kv_cache_groups``,
``group_coordinator``): its window or ``chunk_size`` (chunked local attention) frees the
blocks behind it, and its ``group_tag`` keys its blocks in the shared pool's prefix cache
apart from the other groups' (the same tokens hold other layers' keys there).

When the pool records KV events, each call that registers blocks adds their
``BlockStored`` events (see ``stored_events``).

With an offload tier on the pool (``--kv-offloading-size``), a prefix lookup that
misses the pool goes on in the tier: the blocks found there get fresh pool blocks,
registered under their hashes, and are loaded back (``tier_loads``) before the lookup
is made again, so the sequence takes them as ordinary cache hits.

A model with state layers (``state_slots``) also gives each sequence one state slot: taken
with its first blocks (a sequence that cannot get one waits, as one short of blocks),
freed with its blocks, copied when it forks.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from octavo.kv_cache.block_hash import BlockHash, BlockHasher, HashChain
from octavo.kv_cache.block_pool import BlockPool
from octavo.kv_cache.free_block_queue import KVBlock
from octavo.kv_cache.sliding_window import num_skipped_blocks
from octavo.kv_cache.state_slots import StateSlots
from octavo.kv_cache.stored_events import StoredRuns
from octavo.kv_cache.tier_loads import load_from_tier

if TYPE_CHECKING:
    from octavo.lora_request import LoRARequest


@dataclass
class SequenceBlocks:
    blocks: list[KVBlock] = field(default_factory=list)
    hashes: list[BlockHash] = field(default_factory=list)  # those of registered full blocks
    ids: list[int] | None = None  # the blocks' ids, built once per change (a new list each)


class CacheHits(list):
    """Prefix-cache hits (null blocks for those behind a window) with the chain hash of
    each block, so the sequence's later blocks chain on from them."""

    def __init__(self, blocks: list[KVBlock], hashes: list[BlockHash]) -> None:
        super().__init__(blocks)
        self.hashes = hashes


class KVCacheManager:
    def __init__(
        self,
        pool: BlockPool,
        block_size: int,
        sliding_window: int | None = None,
        hasher: BlockHasher | None = None,
        chunk_size: int | None = None,
        group_tag: bytes = b"",
    ) -> None:
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window must be at least 1, got {sliding_window}")
        self.pool = pool
        self.hasher = hasher or BlockHasher.create()  # --prefix-caching-hash-algo
        self.block_size = block_size
        self.sliding_window = sliding_window  # every layer's window: blocks behind it are freed
        self.tables: dict[int, SequenceBlocks] = {}
        self.pending_copies: list[tuple[int, int]] = []  # (source block, destination block)
        self.state_slots: StateSlots | None = None  # models with state layers (hybrid)
        self.chunk_size = chunk_size  # chunked local attention: blocks of past chunks freed
        self.group_tag = group_tag  # appended to its hashes in the pool (b"": group 0)

    @property
    def frees_blocks(self) -> bool:
        """Does it free blocks behind a window or chunk as sequences advance?"""
        return self.sliding_window is not None or self.chunk_size is not None

    def block_ids(self, seq_id: int) -> list[int]:
        """The sequence's block table as ids. The list is shared until its blocks change
        (then a new one is built), so a step's copy stays as it was: never mutate it."""
        table = self.tables[seq_id]
        if table.ids is None:
            table.ids = [block.block_id for block in table.blocks]
        return table.ids

    def num_tokens_held(self, seq_id: int, num_computed: int) -> int:
        """Computed tokens whose keys/values still sit in blocks (those behind a window
        were freed with their blocks)."""
        table = self.tables.get(seq_id)
        if table is None:
            return 0
        if not self.frees_blocks:
            return num_computed  # nothing is ever freed early
        freed = sum(1 for block in table.blocks if self._is_null(block))
        return max(0, num_computed - freed * self.block_size)

    def find_cached_prefix(
        self, token_ids: list[int], chain: HashChain | None = None
    ) -> list[KVBlock]:
        """Longest cache hit of full blocks, leaving at least one token to compute;
        ``chain`` is the sequence's (its adapter and cache salt are in its hashes, which
        it keeps). Without a window every block of the hit must be cached; with one, only
        those the next token's window reaches (the others come back as the null block, as
        vLLM's sliding-window hit)."""
        if not self.pool.enable_prefix_caching or self.state_slots is not None:
            return []  # (a state layer's state cannot start from a cached block)
        lookup = self.lookup_prefix(token_ids, chain)
        if self.pool.offload is not None and load_from_tier(self, lookup, token_ids):
            lookup = self.lookup_prefix(token_ids, chain)  # the loads may have evicted hits
        for end in range(len(lookup.found), 0, -1):
            hits = lookup.hits_at(end, self._num_skipped(end * self.block_size))
            if hits is not None:
                return hits
        return []

    def lookup_prefix(self, token_ids: list[int], chain: HashChain | None = None) -> PrefixLookup:
        """The cached block (or None) of each full block of ``token_ids`` but the last
        token's."""
        size = self.block_size
        num_blocks = (len(token_ids) - 1) // size
        hashes = self.hasher.extend(chain or HashChain(), token_ids, size, num_blocks)
        found = [
            self.pool.lookup(self._key(block_hash), tuple(token_ids[i * size : (i + 1) * size]))
            for i, block_hash in enumerate(hashes)
        ]
        return PrefixLookup(found, list(hashes), self.pool.null_block)

    def hits_at(self, lookup: PrefixLookup, end: int) -> CacheHits | None:
        """The hits of the first ``end`` blocks if those its window needs are cached."""
        return lookup.hits_at(end, self._num_skipped(end * self.block_size))

    def tier_key(self, block_hash: BlockHash) -> BlockHash:
        """A chain hash as the pool (and the offload tier) keys it."""
        return self._key(block_hash)

    def _key(self, block_hash: BlockHash) -> BlockHash:
        return block_hash + self.group_tag if self.group_tag else block_hash

    def allocate_slots(
        self, seq_id: int, num_computed: int, num_new: int, cached: list[KVBlock] = ()
    ) -> bool:
        """Make room for ``num_new`` tokens after ``num_computed`` ones; False if the pool is short.

        ``cached`` are prefix-cache hits for a sequence that holds no blocks yet; they
        cover the first ``len(cached) * block_size`` tokens (``num_computed`` must equal that).
        """
        if not cached and self._blocks_suffice(seq_id, num_computed, num_new):
            return True  # most decode steps: the slots are in blocks the sequence owns
        if self.state_slots is not None and not self.state_slots.holds(seq_id):
            return self._admit_with_state(seq_id, num_computed, num_new, cached)
        return self._allocate_slots(seq_id, num_computed, num_new, cached)

    def _admit_with_state(
        self, seq_id: int, num_computed: int, num_new: int, cached: list[KVBlock]
    ) -> bool:
        """A sequence new to a model with state layers: a state slot, then its blocks."""
        assert self.state_slots is not None
        if not self.state_slots.take(seq_id):
            return False
        if self._allocate_slots(seq_id, num_computed, num_new, cached):
            return True
        self.state_slots.free(seq_id)
        return False

    def state_slot(self, seq_id: int) -> int:
        """The sequence's state slot (0, the null slot, for a model without state layers)."""
        if self.state_slots is None:
            return 0
        return self.state_slots.slot_of[seq_id]

    def take_state_copies(self) -> list[tuple[int, int]]:
        return [] if self.state_slots is None else self.state_slots.take_pending_copies()

    def _blocks_suffice(self, seq_id: int, num_computed: int, num_new: int) -> bool:
        """Do the blocks held already cover the new slots, with nothing to free (no
        window) and nothing to copy (the first written block is this sequence's alone)?
        Then ``_allocate_slots`` would change nothing."""
        table = self.tables.get(seq_id)
        if table is None or self.frees_blocks:
            return False
        blocks, size = table.blocks, self.block_size
        if num_computed + num_new > len(blocks) * size:
            return False
        offset = num_computed % size
        return num_new == 0 or offset == 0 or blocks[num_computed // size].ref_count <= 1

    def _allocate_slots(
        self, seq_id: int, num_computed: int, num_new: int, cached: list[KVBlock] = ()
    ) -> bool:
        """``allocate_slots``' general path: frees skipped blocks, takes cache hits,
        copies a shared block and allocates the missing ones."""
        if self.blocks_needed(seq_id, num_computed, num_new, cached) > self.pool.num_free_blocks:
            return False
        if cached or seq_id not in self.tables:  # (most steps: a running sequence, no hits)
            self.take_hits(seq_id, num_computed, cached)
        self.allocate_new(seq_id, num_computed, num_new)
        return True

    def blocks_needed(
        self, seq_id: int, num_computed: int, num_new: int, cached: list[KVBlock] = ()
    ) -> int:
        """Free blocks the allocation takes (new ones, a copy, revived cache hits), after
        freeing those behind the window of a sequence that holds blocks."""
        table = self.tables.get(seq_id)
        held = 0
        needs_copy = False
        if table is not None:
            table.ids = None  # the blocks may change
            self._free_skipped_blocks(table, num_computed)
            held = len(table.blocks)
            needs_copy = self._written_block_is_shared(table, num_computed, num_new)
        hits = self._hits_in_window(list(cached), num_computed)
        new_blocks = max(0, -(-(num_computed + num_new) // self.block_size) - held - len(hits))
        revived = sum(1 for block in hits if block.ref_count == 0 and not self._is_null(block))
        return new_blocks + needs_copy + revived

    def take_hits(self, seq_id: int, num_computed: int, cached: list[KVBlock] = ()) -> None:
        """Start the sequence's table with its cache hits (references taken); every
        group of a hybrid model takes its hits before any allocates (which could reuse
        another group's free cached block)."""
        table = self.tables.setdefault(seq_id, SequenceBlocks())
        table.ids = None
        hits = self._hits_in_window(list(cached), num_computed)
        self.pool.touch(self._real(hits))
        table.blocks.extend(hits)
        table.hashes.extend(cached.hashes if isinstance(cached, CacheHits) else _chain_of(cached))

    def allocate_new(self, seq_id: int, num_computed: int, num_new: int) -> None:
        """Copy a shared written block and allocate the missing ones (``blocks_needed``
        said the pool has them)."""
        table = self.tables[seq_id]
        if self._written_block_is_shared(table, num_computed, num_new):
            self._copy_block(table, num_computed // self.block_size)
        have = len(table.blocks)
        new_blocks = max(0, -(-(num_computed + num_new) // self.block_size) - have)
        table.blocks.extend(self.pool.allocate(new_blocks) or [])

    def _free_skipped_blocks(self, table: SequenceBlocks, num_computed: int) -> None:
        """Free the blocks behind the window of the next token (newest first, down to the
        first one freed at an earlier step) and null their table entries."""
        skipped = min(len(table.blocks), self._num_skipped(num_computed))
        freed = []
        for index in range(skipped - 1, -1, -1):
            if self._is_null(table.blocks[index]):
                break
            freed.append(table.blocks[index])
            table.blocks[index] = self.pool.null_block
        self.pool.free(freed)

    def _hits_in_window(self, cached: list[KVBlock], num_computed: int) -> list[KVBlock]:
        """Prefix-cache hits with those behind the window replaced by the null block (no
        reference taken on them); their hashes still chain the sequence's later blocks."""
        skipped = min(len(cached), self._num_skipped(num_computed))
        return [self.pool.null_block] * skipped + cached[skipped:]

    def _num_skipped(self, num_computed: int) -> int:
        window, chunk = self.sliding_window, self.chunk_size
        return num_skipped_blocks(num_computed, window, self.block_size, chunk)

    def _is_null(self, block: KVBlock) -> bool:
        return block is self.pool.null_block

    def _real(self, blocks: list[KVBlock]) -> list[KVBlock]:
        return [block for block in blocks if not self._is_null(block)]

    def _written_block_is_shared(
        self, table: SequenceBlocks, num_computed: int, num_new: int
    ) -> bool:
        """Does the first write go into a partly filled block another sequence holds too?
        (Only that one can be shared: forks share the blocks of computed tokens.)"""
        index = num_computed // self.block_size
        partly_filled = num_new > 0 and num_computed % self.block_size != 0
        return partly_filled and index < len(table.blocks) and table.blocks[index].ref_count > 1

    def _copy_block(self, table: SequenceBlocks, index: int) -> None:
        shared = table.blocks[index]
        (copy,) = self.pool.allocate(1) or []
        self.pending_copies.append((shared.block_id, copy.block_id))
        self.pool.free([shared])
        table.blocks[index] = copy

    def fork(self, parent_id: int, child_id: int, num_computed: int) -> None:
        """Let a child sequence share the blocks of its parent's ``num_computed`` tokens
        (n > 1 sampling); blocks kept ahead for proposals stay the parent's own."""
        parent = self.tables[parent_id]
        shared = parent.blocks[: -(-num_computed // self.block_size)]
        self.pool.touch(self._real(shared))
        self.tables[child_id] = SequenceBlocks(list(shared), list(parent.hashes))
        if self.state_slots is not None:
            self.state_slots.fork(parent_id, child_id)

    def cache_full_blocks(
        self,
        seq_id: int,
        token_ids: list[int],
        num_computed: int,
        chain: HashChain | None = None,
        lora: LoRARequest | None = None,
    ) -> None:
        """Register every block whose tokens are now all computed (hashed in the
        sequence's ``chain``; ``lora`` names the adapter in the KV events)."""
        table = self.tables[seq_id]
        size = self.block_size
        if len(table.hashes) >= num_computed // size:
            return  # no block filled since the last call (most decode steps)
        chain = chain or HashChain(hashes=list(table.hashes))
        hashes = self.hasher.extend(chain, token_ids, size, num_computed // size)
        events = self.pool.events
        stored = None if events is None else StoredRuns(events, size, lora)
        for index in range(len(table.hashes), len(hashes)):
            chunk = tuple(token_ids[index * size : (index + 1) * size])
            parent = table.hashes[-1] if table.hashes else None
            block_hash = hashes[index]
            table.hashes.append(block_hash)
            block = table.blocks[index]
            key = self._key(block_hash)
            parent_key = None if parent is None else self._key(parent)
            registered = not self._is_null(block) and self.pool.register(
                block, key, chunk, parent_key
            )
            if stored is not None and registered:
                stored.add(parent_key, key, chunk)
            elif stored is not None:
                stored.flush()
        if stored is not None:
            stored.flush()

    def free(self, seq_id: int) -> None:
        if self.state_slots is not None:
            self.state_slots.free(seq_id)
        table = self.tables.pop(seq_id, None)
        if table is not None:
            self.pool.free(self._real(list(reversed(table.blocks))))

    def take_pending_copies(self) -> list[tuple[int, int]]:
        copies, self.pending_copies = self.pending_copies, []
        return copies


@dataclass
class PrefixLookup:
    """One group's prefix-cache lookup: each full block's cached block (None: a miss)
    and chain hash; ``hits_at`` cuts it at any length (the coordinator finds the
    longest one every group holds)."""

    found: list[KVBlock | None]
    hashes: list[BlockHash]
    null_block: KVBlock
    last_miss: list[int] = field(init=False)

    def __post_init__(self) -> None:
        misses = (index if block is None else -1 for index, block in enumerate(self.found))
        self.last_miss = list(itertools.accumulate(misses, max))

    def hits_at(self, end: int, skipped: int) -> CacheHits | None:
        """The first ``end`` blocks as hits (the ``skipped`` ones behind the window as
        null blocks) if every other one is cached; None if not."""
        if end == 0 or self.last_miss[end - 1] >= skipped:
            return None
        blocks = [self.null_block] * skipped + self.found[skipped:end]
        return CacheHits(blocks, self.hashes[:end])  # type: ignore[arg-type]


def _chain_of(blocks: list[KVBlock]) -> list[BlockHash]:
    hashes = [block.block_hash for block in blocks]
    assert all(h is not None for h in hashes), "cache hits must be registered blocks"
    return hashes  # type: ignore[return-value]
