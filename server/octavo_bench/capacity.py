"""KV-cache arithmetic: how many sequences a memory budget holds, contiguous vs paged."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass

import torch

from octavo.kv_cache.cache_tensors import bytes_per_block
from octavo.model_executor.kv_layer_kinds import kv_layer_kinds
from octavo.model_executor.model_config import ModelConfig


@dataclass
class SequencesThatFit:
    """Sequences a KV budget holds: preallocated at max_model_len vs paged at actual length."""

    kv_budget_bytes: int
    bytes_per_token: int
    max_model_len: int
    block_size: int
    mean_sequence_tokens: float  # prompt + output, mean over the workload
    contiguous: int  # floor(B / (bytes_per_token * max_model_len))
    paged: int  # usable blocks // blocks per mean-length sequence
    peak_running_measured: int  # most sequences running at once in the Octavo run

    def as_dict(self) -> dict:
        return asdict(self)


def bytes_per_token(config: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes of keys and values one token occupies across the layers that keep them (a
    hybrid model's state layers keep a fixed state per sequence instead)."""
    attention_layers = sum(kind is not None for kind in kv_layer_kinds(config))
    return bytes_per_block(dataclasses.replace(config, num_layers=attention_layers), 1, dtype)


def sequences_that_fit(
    config: ModelConfig,
    dtype: torch.dtype,
    budget: int,
    max_model_len: int,
    block_size: int,
    mean_tokens: float,
    peak_running: int,
) -> SequencesThatFit:
    per_token = bytes_per_token(config, dtype)
    usable_blocks = budget // (per_token * block_size) - 1  # block 0 is the null block
    blocks_per_sequence = max(1, math.ceil(mean_tokens / block_size))
    return SequencesThatFit(
        kv_budget_bytes=budget,
        bytes_per_token=per_token,
        max_model_len=max_model_len,
        block_size=block_size,
        mean_sequence_tokens=round(mean_tokens, 1),
        contiguous=budget // (per_token * max_model_len),
        paged=max(0, usable_blocks) // blocks_per_sequence,
        peak_running_measured=peak_running,
    )
