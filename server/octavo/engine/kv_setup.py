"""The engine's KV cache: its budget, the blocks each worker allocates, and the block pool
and manager over them (a block table per sequence, or per group of layers)."""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass

import torch

from octavo.arg_types import parse_size
from octavo.config import DEFAULT_CPU_KV_CACHE_MEMORY, EngineArgs
from octavo.executor.executor import Executor
from octavo.kv_cache.block_hash import BlockHasher
from octavo.kv_cache.block_pool import BlockPool
from octavo.kv_cache.cache_tensors import bytes_per_block
from octavo.kv_cache.group_coordinator import KVCacheCoordinator
from octavo.kv_cache.kv_cache_groups import KVCacheGroups, blocks_per_sequence
from octavo.kv_cache.kv_cache_manager import KVCacheManager
from octavo.kv_cache.sliding_window import max_blocks_per_sequence
from octavo.kv_cache.state_slots import StateSlots
from octavo.kv_events.events import MEDIUM_CPU, MEDIUM_STORAGE
from octavo.worker.worker import KVBudget, WorkerConfig

logger = logging.getLogger(__name__)

KV_CACHE_MEMORY_ENV = "OCTAVO_KV_CACHE_MEMORY"


@dataclass
class CacheShape:
    """What the pool and its manager depend on, beside the arguments."""

    device: torch.device
    window: int | None  # a uniform sliding window: blocks behind it are freed
    groups: KVCacheGroups | None  # a block table per group of layers
    states: bool  # state layers: a state slot per sequence, no prefix caching
    encoder: bool  # an encoder: whole prompts, no prefix caching


def block_pool(
    args: EngineArgs, spec: WorkerConfig, num_blocks: int, shape: CacheShape
) -> BlockPool:
    """The pool of ``num_blocks`` blocks, prefix caching where the cache allows it, and the
    offload tier (``--kv-offloading-size``) behind it."""
    events = args.kv_events_config
    caches_prefixes = args.enable_prefix_caching and not shape.states and not shape.encoder
    pool = BlockPool(num_blocks, caches_prefixes, events is not None and events.publishes)
    if spec.kv_offload_blocks:
        block_bytes = bytes_per_block(spec.config, args.block_size, spec.cache_dtype)
        medium = MEDIUM_STORAGE if shape.device.type == "cpu" else MEDIUM_CPU  # CPU: a mapped file
        pool.attach_offload(spec.kv_offload_blocks, args.block_size, block_bytes, medium)
    return pool


def kv_cache_manager(
    args: EngineArgs, pool: BlockPool, hasher: BlockHasher, shape: CacheShape
) -> KVCacheManager | KVCacheCoordinator:
    """One block table per sequence over the pool, or one per group (``KVCacheCoordinator``);
    with state layers, a state slot per running sequence too (and the null slot 0)."""
    kv: KVCacheManager | KVCacheCoordinator
    if shape.groups is not None:
        kv = KVCacheCoordinator(pool, args.block_size, shape.groups, hasher)
    else:
        kv = KVCacheManager(pool, args.block_size, shape.window, hasher)
    if shape.states:
        kv.state_slots = StateSlots(args.max_num_seqs + 1)
    return kv


def kv_budget(
    args: EngineArgs, device: torch.device, num_speculative_tokens: int, max_model_len: int
) -> KVBudget:
    """The workers' KV budget: ``--kv-cache-memory`` bytes wherever it is given (on CPU
    else ``$OCTAVO_KV_CACHE_MEMORY``, the server's variable, for the offline ``LLM`` too;
    else 2 GiB), else on a GPU the ``--gpu-memory-utilization`` share."""
    kv_bytes = args.kv_cache_memory
    if kv_bytes is None and device.type != "cuda":
        kv_bytes = cpu_kv_cache_default()
    return KVBudget(
        kv_bytes,
        args.gpu_memory_utilization,
        args.token_budget(device, max_model_len),
        args.max_num_seqs,
        num_speculative_tokens,
    )


def offload_blocks(args: EngineArgs, spec: WorkerConfig, special_cache: bool) -> int:
    """Blocks of the KV offload tier (``--kv-offloading-size`` GiB over every rank, as
    vLLM: each rank keeps that many blocks of its shard); 0 without one. ValueError
    where it cannot work: no prefix caching, a sliding window, a draft model, KV cache
    groups, state layers or an encoder (their caches are not one plain pool)."""
    if args.kv_offloading_size is None:
        return 0
    reasons = {
        "prefix caching is off": not args.enable_prefix_caching,
        "a sliding window": spec.config.uniform_sliding_window is not None,
        "a draft model": spec.draft is not None,
        "KV cache groups, state layers or an encoder": special_cache,
    }
    refused = [reason for reason, applies in reasons.items() if applies]
    if refused:
        raise ValueError(f"--kv-offloading-size is not supported with {', '.join(refused)}")
    block_bytes = bytes_per_block(spec.config, spec.block_size, spec.cache_dtype)
    num_blocks = int(args.kv_offloading_size * (1 << 30)) // block_bytes
    if num_blocks < 1:
        raise ValueError(
            f"--kv-offloading-size {args.kv_offloading_size} GiB holds no KV block "
            f"({block_bytes} bytes each)"
        )
    return num_blocks


def cpu_kv_cache_default() -> int:
    """``$OCTAVO_KV_CACHE_MEMORY`` when set (a bad value is refused, naming it), else 2 GiB."""
    text = os.environ.get(KV_CACHE_MEMORY_ENV)
    if not text:
        return DEFAULT_CPU_KV_CACHE_MEMORY
    try:
        return parse_size(text)
    except argparse.ArgumentTypeError as error:
        raise ValueError(f"{KV_CACHE_MEMORY_ENV}: {error}") from None


def allocate_cache(
    executor: Executor,
    args: EngineArgs,
    max_model_len: int,
    num_speculative_tokens: int,
    shape: CacheShape,
) -> int:
    """Size the KV cache (the fewest blocks any worker can hold) and allocate it; it must
    hold one sequence of ``max_model_len`` tokens (behind a uniform window: the window and
    one step's tokens, as blocks behind it are freed). Returns the number of blocks."""
    device, window, groups = shape.device, shape.window, shape.groups
    budget = kv_budget(args, device, num_speculative_tokens, max_model_len)
    num_blocks = executor.num_available_blocks(budget)
    if device.type == "cuda" and num_blocks <= 0:
        raise ValueError(
            "no GPU memory left for the KV cache; raise gpu_memory_utilization "
            "or lower max_num_batched_tokens / max_num_seqs"
        )
    _log_cache(num_blocks, args, budget)
    step_tokens = budget.max_num_batched_tokens + num_speculative_tokens
    needed = max_blocks_per_sequence(max_model_len, args.block_size, window, step_tokens)
    if groups is not None:  # the blocks of every group (each behind its own window)
        needed = blocks_per_sequence(groups, max_model_len, args.block_size, step_tokens)
    _check_capacity(num_blocks, args.block_size, max_model_len, needed)
    executor.initialize_cache(num_blocks)
    return num_blocks


def _log_cache(num_blocks: int, args: EngineArgs, budget: KVBudget) -> None:
    size = budget.kv_cache_bytes
    where = "" if size is None else f" in a budget of {size / 2**20:.0f} MiB per worker"
    logger.info(
        "KV cache: %d blocks of %d tokens (%d tokens, %s)%s",
        num_blocks,
        args.block_size,
        num_blocks * args.block_size,
        args.kv_cache_dtype,
        where,
    )


def _check_capacity(num_blocks: int, block_size: int, max_model_len: int, needed: int) -> None:
    """``needed``: the blocks one sequence of ``max_model_len`` tokens holds at most."""
    capacity = (num_blocks - 1) * block_size  # block 0 is the null block
    if num_blocks - 1 < needed:
        raise ValueError(
            f"the KV cache holds {capacity} tokens, fewer than max_model_len={max_model_len} "
            f"needs ({needed * block_size}); "
            "raise kv_cache_memory / gpu_memory_utilization or lower max_model_len"
        )
