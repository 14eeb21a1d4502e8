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
    """Also what one step's activations depend on (``gpu_budget``'s estimate)."""

    num_heads: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int


def bytes_per_block(config: KVShape, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of one block in every layer, keys and values, in the cache's ``dtype`` (an fp8
    cache: one byte an element, half of bf16's)."""
    element = torch.empty((), dtype=dtype).element_size()
    per_layer = 2 * block_size * config.num_kv_heads * config.head_dim * element
    return per_layer * config.num_layers


def allocate_kv_caches(
    config: KVShape, num_blocks: int, block_size: int, dtype: torch.dtype, device
) -> list[torch.Tensor]:
    shape = (2, num_blocks, block_size, config.num_kv_heads, config.head_dim)
    return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]


def copy_blocks(kv_caches: list[torch.Tensor], copies: list[tuple[int, int]]) -> None:
    """Copy-on-write: duplicate whole blocks (keys and values, every layer). Blocks are
    copied as bytes, so an fp8 cache's stored values (and their scales' meaning) stay."""
    if not copies:
        return
    device = kv_caches[0].device
    sources = torch.tensor([src for src, _ in copies], device=device)
    targets = torch.tensor([dst for _, dst in copies], device=device)
    for cache in kv_caches:
        raw = cache.view(torch.uint8) if cache.element_size() == 1 else cache
        raw[:, targets] = raw[:, sources]
