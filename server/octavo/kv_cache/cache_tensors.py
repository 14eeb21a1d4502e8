"""Sizing and allocating the per-layer KV cache tensors from a memory budget."""

from __future__ import annotations

import logging

import torch

from octavo.model_executor.model_config import ModelConfig

logger = logging.getLogger(__name__)


def bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    element = torch.empty((), dtype=dtype).element_size()
    per_layer = 2 * block_size * config.num_kv_heads * config.head_dim * element
    return per_layer * config.num_layers


def cuda_kv_budget(gpu_memory_utilization: float, device: torch.device) -> int:
    """Bytes left for the KV cache once weights and a profiled peak step are accounted for."""
    free, total = torch.cuda.mem_get_info(device)
    used_by_others = total - free - torch.cuda.memory_reserved(device)
    peak = torch.cuda.max_memory_allocated(device)
    return int(total * gpu_memory_utilization) - used_by_others - peak


def allocate_kv_caches(
    config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device
) -> list[torch.Tensor]:
    shape = (2, num_blocks, block_size, config.num_kv_heads, config.head_dim)
    return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]


def copy_blocks(kv_caches: list[torch.Tensor], copies: list[tuple[int, int]]) -> None:
    """Copy-on-write: duplicate whole blocks (keys and values, every layer)."""
    if not copies:
        return
    device = kv_caches[0].device
    sources = torch.tensor([src for src, _ in copies], device=device)
    targets = torch.tensor([dst for _, dst in copies], device=device)
    for cache in kv_caches:
        cache[:, targets] = cache[:, sources]
