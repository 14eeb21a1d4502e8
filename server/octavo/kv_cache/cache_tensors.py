"""Sizing and allocating the per-layer KV cache tensors from a memory budget.

The model's shape comes in as any object with the attributes below (the model
executor's ``ModelConfig`` has them all), so this package needs nothing from it.

One layer's cache is ``[planes, num_blocks, block_size, heads, dim]`` (``KVLayout``): a key
and a value plane of the KV heads, or, for multi-head latent attention (DeepSeek-V2/V3,
a shape whose ``kv_latent_dim`` is set), one plane of one "head": each token's compressed
latent and its roped key part, ``kv_lora_rank + qk_rope_head_dim`` values.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

import torch

from octavo.kv_cache.huge_pages import zeros_on_huge_pages

logger = logging.getLogger(__name__)


class KVShape(Protocol):
    """What the KV cache's size depends on: layers, and keys/values per token and layer.
    A shape may also have ``kv_latent_dim`` (MLA's latent per token and layer; None or
    absent: keys and values)."""

    num_layers: int
    num_kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class KVLayout:
    """One layer's cache after ``(planes, blocks, block_size)``: ``heads`` x ``dim``."""

    planes: int  # 2: keys and values; 1: MLA's latent
    heads: int
    dim: int

    @classmethod
    def of(cls, config: KVShape) -> KVLayout:
        latent = getattr(config, "kv_latent_dim", None)
        if latent:
            return cls(1, 1, latent)
        return cls(2, config.num_kv_heads, config.head_dim)

    @property
    def values_per_token(self) -> int:
        return self.planes * self.heads * self.dim


def bytes_per_token(config: KVShape, dtype: torch.dtype) -> int:
    """Bytes one token takes in the cache over every layer (README's model table)."""
    return bytes_per_block(config, 1, dtype)


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
    per_layer = block_size * KVLayout.of(config).values_per_token * element
    return per_layer * config.num_layers


def allocate_kv_caches(
    config: KVShape, num_blocks: int, block_size: int, dtype: torch.dtype, device
) -> list[torch.Tensor]:
    layout = KVLayout.of(config)
    shape = (layout.planes, num_blocks, block_size, layout.heads, layout.dim)
    if torch.device(device).type == "cpu":  # read block by block all over: huge pages
        return [zeros_on_huge_pages(shape, dtype) for _ in range(config.num_layers)]
    return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]


def copy_blocks(kv_caches: list[torch.Tensor], copies: list[tuple[int, int]]) -> None:
    """Copy-on-write: duplicate whole blocks (keys and values, every layer). Blocks are
    copied as bytes, so an fp8 cache's stored values (and their scales' meaning) stay."""
    if not copies:
        return
    kv_caches = [cache for cache in kv_caches if isinstance(cache, torch.Tensor)]  # no states
    device = kv_caches[0].device
    sources = torch.tensor([src for src, _ in copies], device=device)
    targets = torch.tensor([dst for _, dst in copies], device=device)
    for cache in kv_caches:
        raw = cache.view(torch.uint8) if cache.element_size() == 1 else cache
        raw[:, targets] = raw[:, sources]
