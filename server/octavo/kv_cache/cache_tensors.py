"""Sizing and allocating the per-layer KV cache tensors from a memory budget.

The model's shape comes in as any object with the attributes below (the model
executor's ``ModelConfig`` has them all), so this package needs nothing from it.
"""

from __future__ import annotations

import logging
from typing import Protocol

import torch

logger = logging.getLogger(__name__)


class KVShape(Protocol):
    """What the KV cache's size depends on: layers, and keys/values per token and layer."""

    num_layers: int
    num_kv_heads: int
    head_dim: int


class ModelShape(KVShape, Protocol):
    """Also what one step's activations depend on (the GPU budget's estimate)."""

    num_heads: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int


def bytes_per_block(config: KVShape, block_size: int, dtype: torch.dtype) -> int:
    element = torch.empty((), dtype=dtype).element_size()
    per_layer = 2 * block_size * config.num_kv_heads * config.head_dim * element
    return per_layer * config.num_layers


def cuda_kv_budget(
    gpu_memory_utilization: float,
    device: torch.device,
    config: ModelShape,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    dtype: torch.dtype,
) -> int:
    """Bytes left for the KV cache on a GPU once weights and one step's activations fit.

    The weights are already loaded (counted as allocated); activations of the largest
    step are estimated from its shapes: a few hidden-sized and two intermediate-sized
    tensors per token, plus fp32 logits for every sequence that samples.
    """
    free, total = torch.cuda.mem_get_info(device)
    used_by_others = total - free - torch.cuda.memory_reserved(device)
    element = torch.empty((), dtype=dtype).element_size()
    qkv = (config.num_heads + 2 * config.num_kv_heads) * config.head_dim
    per_token = (6 * config.hidden_size + 3 * config.intermediate_size + qkv) * element
    activations = max_num_batched_tokens * per_token + max_num_seqs * config.vocab_size * 8
    weights = torch.cuda.memory_allocated(device)
    return int(total * gpu_memory_utilization) - used_by_others - weights - activations


def allocate_kv_caches(
    config: KVShape, num_blocks: int, block_size: int, dtype: torch.dtype, device
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
