"""The KV offload tier's bookkeeping (scheduler side): which evicted prefix-cache blocks
sit in host memory, and the copies a step must make (``--kv-offloading-size``).

When the block pool reuses a block whose hash is cached, its keys/values are about to be
written over: the tier saves them first, in one of its ``num_slots`` host slots (LRU: a
full tier drops its least recently used entry). A prefix lookup that misses the pool but
finds the following blocks here takes fresh pool blocks, registers them under those
hashes and loads them back (``KVCacheManager.find_cached_prefix``). The tier keeps its
copy after a load (as vLLM's CPU tier), so a block evicted again is not saved twice.

The copies are plain ``TierCopy`` records (block id, slot, direction) collected in the
order they were decided and sent with the step: every rank replays them, in that order,
on its own shard (``offload_tensors``) before the step's copy-on-write copies and
forward pass. Replaying in order is what keeps it exact: a slot dropped and refilled in
one step is read by an earlier load before a later save writes it, and a pool block
saved and then reused as a load's destination is saved before it is written.

When the pool records KV events, the tier adds ``BlockStored``/``BlockRemoved`` with
``medium="CPU"`` (vLLM's name for its host offload tier), or ``"STORAGE"`` (its fs
tier's) where the cache is on CPU and the tier is a mapped file (``mapped_tier_file``).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import NamedTuple

from octavo.kv_cache.block_hash import BlockHash
from octavo.kv_events.events import MEDIUM_CPU, BlockRemoved, BlockStored, KVCacheEvent, wire_hash


class TierCopy(NamedTuple):
    """One block copied between the KV cache and the tier (``to_tier``: a save)."""

    to_tier: bool
    block_id: int
    slot: int


@dataclass
class TierEntry:
    slot: int
    token_ids: tuple[int, ...]
    parent: BlockHash | None  # the chain hash of the block before it (None: a first block)


@dataclass
class OffloadCounters:
    """Running totals for ``/metrics`` (blocks; bytes are blocks x ``bytes_per_block``)."""

    bytes_per_block: int  # one block over every layer and rank
    queries: int = 0  # prompt tokens looked up in the tier (those the pool missed)
    hits: int = 0  # of which loaded from the tier
    stored_blocks: int = 0  # saved to the tier (GPU_to_CPU)
    loaded_blocks: int = 0  # loaded back (CPU_to_GPU)

    def copy(self) -> OffloadCounters:
        return OffloadCounters(**vars(self))


@dataclass
class OffloadTier:
    num_slots: int
    block_size: int
    bytes_per_block: int
    events: list[KVCacheEvent] | None = None  # the pool's event list (None: no events)
    medium: str = MEDIUM_CPU  # MEDIUM_STORAGE for the file-backed tier of a CPU deployment
    entries: OrderedDict[BlockHash, TierEntry] = field(default_factory=OrderedDict)
    copies: list[TierCopy] = field(default_factory=list)
    counters: OffloadCounters = field(init=False)

    def __post_init__(self) -> None:
        if self.num_slots < 1:
            raise ValueError(f"the KV offload tier needs at least 1 block, got {self.num_slots}")
        self._free_slots = list(range(self.num_slots - 1, -1, -1))
        self.counters = OffloadCounters(self.bytes_per_block)

    def save(
        self,
        block_hash: BlockHash,
        token_ids: tuple[int, ...],
        parent: BlockHash | None,
        block_id: int,
    ) -> None:
        """Keep an evicted cached block (its pool block is about to be reused)."""
        if block_hash in self.entries:
            self.entries.move_to_end(block_hash)  # the same keys/values are already here
            return
        if not self._free_slots:
            self._drop_oldest()
        slot = self._free_slots.pop()
        self.entries[block_hash] = TierEntry(slot, token_ids, parent)
        self.copies.append(TierCopy(True, block_id, slot))
        self.counters.stored_blocks += 1
        self._record_stored(block_hash, token_ids, parent)

    def lookup(self, block_hash: BlockHash, token_ids: tuple[int, ...]) -> TierEntry | None:
        entry = self.entries.get(block_hash)
        if entry is None or entry.token_ids != token_ids:
            return None
        return entry

    def load(self, block_hash: BlockHash, block_id: int) -> None:
        """Copy a tier entry (found by ``lookup``) into pool block ``block_id``."""
        self.entries.move_to_end(block_hash)
        self.copies.append(TierCopy(False, block_id, self.entries[block_hash].slot))
        self.counters.loaded_blocks += 1

    def take_copies(self) -> list[TierCopy]:
        """The copies decided since the last call, in order (the step's)."""
        copies, self.copies = self.copies, []
        return copies

    def clear(self) -> None:
        """Forget every entry (a reset of the prefix cache resets the tier too)."""
        self._record_removed(list(self.entries))
        self._free_slots = list(range(self.num_slots - 1, -1, -1))
        self.entries.clear()

    def _drop_oldest(self) -> None:
        block_hash, entry = self.entries.popitem(last=False)
        self._free_slots.append(entry.slot)
        self._record_removed([block_hash])

    def _record_stored(
        self, block_hash: BlockHash, token_ids: tuple[int, ...], parent: BlockHash | None
    ) -> None:
        if self.events is None:
            return
        self.events.append(
            BlockStored(
                block_hashes=[wire_hash(block_hash)],
                parent_block_hash=None if parent is None else wire_hash(parent),
                token_ids=list(token_ids),
                block_size=self.block_size,
                medium=self.medium,
            )
        )

    def _record_removed(self, hashes: list[BlockHash]) -> None:
        if self.events is not None and hashes:
            wire = [wire_hash(h) for h in hashes]
            self.events.append(BlockRemoved(wire, medium=self.medium))
