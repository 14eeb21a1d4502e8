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


def cuda_kv_budget(
    gpu_memory_utilization: float,
    device: torch.device,
    config: ModelConfig,
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
