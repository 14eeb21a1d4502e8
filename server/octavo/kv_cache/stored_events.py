"""``BlockStored`` events for the blocks one sequence registers in one call.

vLLM publishes one ``BlockStored`` per call that caches a sequence's new full blocks.
Here a block whose hash is already cached under another block (Octavo keeps one block
per hash), or a null block behind a sliding window, is not newly stored: it ends a run,
and each run of newly stored consecutive blocks is one event. An event's parent is the
wire hash of the block before its first one in the sequence (announced earlier: it is
cached, or was), None for a sequence's first block (the chain's seed, adapter and cache
salt are no block: vLLM sends None there too), and the event names the adapter in
``lora_id`` / ``lora_name`` (llm-d keys the adapter's blocks by ``lora_name``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from octavo.kv_cache.block_hash import BlockHash
from octavo.kv_events.events import BlockStored, KVCacheEvent, wire_hash

if TYPE_CHECKING:
    from octavo.lora_request import LoRARequest


@dataclass
class StoredRuns:
    events: list[KVCacheEvent]  # the pool's, appended to
    block_size: int
    lora: LoRARequest | None = None
    _hashes: list[int] = field(default_factory=list)
    _token_ids: list[int] = field(default_factory=list)
    _parent: int | None = None

    def add(
        self, parent: BlockHash | None, block_hash: BlockHash, token_ids: tuple[int, ...]
    ) -> None:
        """A newly stored block, ``parent`` the chain hash of the one before (None first)."""
        if not self._hashes:
            self._parent = None if parent is None else wire_hash(parent)
        self._hashes.append(wire_hash(block_hash))
        self._token_ids.extend(token_ids)

    def flush(self) -> None:
        """End the current run (a block not newly stored, or the call's end)."""
        if not self._hashes:
            return
        lora = self.lora
        self.events.append(
            BlockStored(
                block_hashes=self._hashes,
                parent_block_hash=self._parent,
                token_ids=self._token_ids,
                block_size=self.block_size,
                lora_id=None if lora is None else lora.lora_int_id,
                lora_name=None if lora is None else lora.lora_name,
            )
        )
        self._hashes, self._token_ids = [], []
