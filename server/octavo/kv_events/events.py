"""KV cache events and their msgpack wire format, as vLLM 0.32 publishes them.

A batch is a msgpack array ``[ts, events, data_parallel_rank]`` (vLLM's ``EventBatch``:
msgspec ``array_like=True``; the publisher fills the rank, 0 here: Octavo has no data
parallelism). Each event is a msgpack map tagged ``{"type": "<class name>", ...}`` (vLLM's
``KVCacheEvent``: msgspec ``tag=True, omit_defaults=True``; vLLM dropped ``array_like``
from the events in vllm-project/vllm#42892): the fields without a default are always
written, ``None`` as nil, in declaration order after the tag. The llm-d router (and
llm-d-kv-cache v0.9.0's vLLM adapter) reads these maps by name, as well as vLLM's older
positional arrays.

Block hashes on the wire are unsigned 64-bit integers (vLLM's
``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` form): the engine's block hashes are SHA-256
digests (``kv_cache/block_hash.py``), and ``wire_hash`` sends their low 64 bits, as vLLM
does, with the top bit set. That bit keeps every hash a full 8-byte msgpack uint64:
llm-d's decoder takes a hash only as a 64-bit integer (a value under 2**32, which msgpack
packs shorter, fails the whole batch there), and never 0, which llm-d reads as "no
parent". ``medium`` is ``"GPU"``, vLLM's name for the
engine's own KV cache tier whatever the device, and ``"CPU"`` for the host-memory offload
tier (``--kv-offloading-size``; llm-d weighs ``"CPU"`` hits as an offload tier's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"  # the KV offload tier (kv_cache/offload_tier.py)
MEDIUM_STORAGE = "STORAGE"  # the file-backed tier of a CPU deployment (vLLM's fs tier's name)
UINT64_MASK = (1 << 64) - 1
TOP_BIT = 1 << 63


def wire_hash(block_hash: bytes) -> int:
    """A block hash (a digest) as its unsigned 64-bit wire value: its low 64 bits
    (vLLM's ``maybe_convert_block_hash``) with the top bit set."""
    return (int.from_bytes(block_hash, "big") & UINT64_MASK) | TOP_BIT


@dataclass(slots=True)
class BlockStored:
    """Full blocks newly cached, consecutive in one sequence: ``token_ids`` holds
    ``block_size`` tokens per hash; ``parent_block_hash`` is the wire hash of the block
    before the first (None for a sequence's first block)."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None  # vLLM: deprecated in favour of lora_name, still sent
    medium: str | None = MEDIUM_GPU
    lora_name: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return {
            "type": "BlockStored",
            "block_hashes": self.block_hashes,
            "parent_block_hash": self.parent_block_hash,
            "token_ids": self.token_ids,
            "block_size": self.block_size,
            "lora_id": self.lora_id,
            "medium": self.medium,
            "lora_name": self.lora_name,
        }


@dataclass(slots=True)
class BlockRemoved:
    """Cached blocks whose hashes were dropped (their blocks reused for other tokens)."""

    block_hashes: list[int]
    medium: str | None = MEDIUM_GPU

    def to_wire(self) -> dict[str, Any]:
        return {"type": "BlockRemoved", "block_hashes": self.block_hashes, "medium": self.medium}


@dataclass(slots=True)
class AllBlocksCleared:
    """Nothing is cached any more (an engine start, or a reset of the whole prefix cache)."""

    def to_wire(self) -> dict[str, Any]:
        return {"type": "AllBlocksCleared"}


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(slots=True)
class KVEventBatch:
    """The events of one engine step, in the order they happened."""

    ts: float
    events: list[KVCacheEvent] = field(default_factory=list)
    data_parallel_rank: int = 0

    def encode(self) -> bytes:
        wire = [self.ts, [event.to_wire() for event in self.events], self.data_parallel_rank]
        return msgpack.packb(wire, use_bin_type=True)
