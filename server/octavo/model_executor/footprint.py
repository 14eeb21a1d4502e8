"""What a loaded model's weights take in memory, as stored: quantized blocks, and the
prepacked layouts of the unquantized linears (``UnquantizedLinearMethod``: fp32 in the
native kernel's column panels, bf16 in oneDNN's layout).

A prepacked linear drops its plain weight, except a tied LM head: the embedding keeps the
table its lookup reads, so the head's packed matrix is a second copy of it (SmolLM2 in
fp32: 513.1 → 621.1 MiB; a Gemma-2-2B-sized head, 256000 x 2304, +2.2 GiB). The CPU KV
budget (``kv_cache/cpu_budget.py``) and the load log count it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class WeightFootprint:
    total: int  # every weight as stored, a storage shared by two modules once
    prepacked: int  # of which in packed layouts (panels or oneDNN's)
    copies: int  # of which packed copies of a matrix kept plain too (a tied LM head)


def weight_footprint(model: nn.Module) -> WeightFootprint:
    packed = [getattr(m, "packed_weight", None) for m in model.modules()]
    return WeightFootprint(weight_bytes(model), _unique_bytes(packed), tied_copy_bytes(model))


def tied_copy_bytes(model: nn.Module) -> int:
    """Bytes of the LM head's packed matrix when it is tied to an embedding the model
    keeps (its lookup reads the plain table), else 0."""
    config, embedding = getattr(model, "config", None), getattr(model, "embed_tokens", None)
    head = getattr(model, "lm_head", None)
    packed = getattr(head, "packed_weight", None)
    if packed is None or embedding is None or not getattr(config, "tie_word_embeddings", False):
        return 0
    return _unique_bytes([packed])


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's weights as stored (quantized or prepacked ones included; a
    tensor shared by two modules counted once)."""
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [getattr(m, "packed_weight", None) for m in model.modules()]
    return _unique_bytes(tensors)


def _unique_bytes(tensors: list[torch.Tensor | None]) -> int:
    unique = {_storage_key(t): t.numel() * t.element_size() for t in tensors if t is not None}
    return sum(unique.values())


def _storage_key(tensor: torch.Tensor) -> int:
    """Shared storage is one key; oneDNN-packed (opaque) tensors have no data pointer."""
    return tensor.data_ptr() if tensor.layout == torch.strided else id(tensor)
