"""CPU attention with the native kernels: keys/values stored and decode attention read
straight from the cache blocks (no gather). Prefill chunks take the torch path, and so do
the decodes of chunked local attention (the kernel's window is one length for the whole
batch; a chunk's visible span differs per sequence). An fp8 cache is written and read by
the kernels too (``kv_quant``'s conversions, bit for bit)."""

from __future__ import annotations

import torch

from octavo.attention.backend import TorchAttention
from octavo.attention.kv_quant import UNIT_SCALES, KVScales
from octavo.attention.metadata import AttentionMetadata
from octavo.attention.options import FULL_ATTENTION, AttentionOptions


class NativeCpuAttention(TorchAttention):
    def __init__(self, ops) -> None:
        self.ops = ops  # torch.ops.octavo_cpu

    def store(self, key, value, kv_cache, meta: AttentionMetadata, kv_scales: KVScales) -> None:
        self.ops.store_kv(key, value, kv_cache, meta.slot_mapping, kv_scales.k, kv_scales.v)

    def decode(
        self,
        query,
        kv_cache,
        meta: AttentionMetadata,
        scale: float,
        kv_scales: KVScales = UNIT_SCALES,
        options: AttentionOptions = FULL_ATTENTION,
    ) -> torch.Tensor:
        if options.chunk_size is not None:
            return super().decode(query, kv_cache, meta, scale, kv_scales, options)
        first = meta.num_prefills
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
        self.ops.paged_decode_attention(
            out,
            query,
            kv_cache,
            meta.block_tables[first:],
            meta.seq_lens[first:],
            scale,
            kv_scales.k,
            kv_scales.v,
            *(() if options.is_plain else native_options(options)),
        )
        return out


def native_options(options: AttentionOptions) -> tuple[int, float, torch.Tensor | None]:
    """The kernel's spelling: window 0 and soft-cap 0.0 mean none; sinks float32 or None."""
    sinks = options.sinks
    if sinks is not None:
        sinks = sinks.to(torch.float32).contiguous()
    return options.sliding_window or 0, options.soft_cap or 0.0, sinks
