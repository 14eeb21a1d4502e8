"""CPU attention with the native kernels: keys/values stored and decode attention read
straight from the cache blocks (no gather). Prefill chunks take the torch path."""

from __future__ import annotations

import torch

from octavo.attention.backend import TorchAttention
from octavo.attention.metadata import AttentionMetadata


class NativeCpuAttention(TorchAttention):
    def __init__(self, ops) -> None:
        self.ops = ops  # torch.ops.octavo_cpu

    def forward(self, query, key, value, kv_cache, meta: AttentionMetadata, scale: float):
        self.ops.store_kv(key, value, kv_cache, meta.slot_mapping)
        outputs = [
            self._prefill(i, query, key, value, kv_cache, meta, scale)
            for i in range(meta.num_prefills)
        ]
        if meta.num_decodes:
            outputs.append(self._decode_in_place(query, kv_cache, meta, scale))
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs)

    def _decode_in_place(self, query, kv_cache, meta: AttentionMetadata, scale: float):
        first = meta.num_prefills
        decode_query = query[meta.num_prefill_tokens :]
        out = torch.empty(decode_query.shape, dtype=query.dtype, device=query.device)
        self.ops.paged_decode_attention(
            out, decode_query, kv_cache, meta.block_tables[first:], meta.seq_lens[first:], scale
        )
        return out
