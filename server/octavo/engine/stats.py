"""Engine statistics the server exports as Prometheus metrics (vLLM's names)."""

from __future__ import annotations

from dataclasses import dataclass

from octavo.kv_cache.offload_tier import OffloadCounters
from octavo.kv_transfer.counters import TransferStats
from octavo.scheduler.spec_decode_counters import SpecDecodeCounters


@dataclass
class EngineStats:
    num_running: int
    num_waiting: int
    kv_cache_usage: float  # fraction of usable blocks in use
    kv_cache_tokens_held: int  # tokens whose keys/values sit in allocated blocks
    kv_cache_slots_allocated: int  # block_size * blocks in use
    num_blocks: int
    prefix_cache_queries: int  # prompt tokens looked up (counter)
    prefix_cache_hits: int  # of which served from the cache (counter)
    num_preemptions: int  # counter
    prompt_tokens: int  # counter
    generation_tokens: int  # counter
    spec_decode: SpecDecodeCounters | None = None  # with speculative decoding on (counters)
    max_loras: int = 0  # adapters in one step; 0 with LoRA off
    running_loras: tuple[str, ...] = ()  # adapters of running requests, by name (sorted)
    waiting_loras: tuple[str, ...] = ()
    kv_offload: OffloadCounters | None = None  # with --kv-offloading-size (counters)
    kv_transfer: TransferStats | None = None  # with --kv-transfer-config (counters)
