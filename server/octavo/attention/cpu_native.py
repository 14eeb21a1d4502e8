"""CPU attention with the native kernels: keys/values stored, and prefill and decode
attention read straight from the cache blocks (no gather, no mask tensor). Every prefill
chunk of a step goes to one kernel call, its tiles spread over the threads. The torch path
keeps what the kernels do not do: chunked local attention (a chunk's visible span differs
per sequence), Gemma 3's both-ways image spans, and head sizes the prefill kernel is not
built for. An fp8 cache is written and read by the kernels too (``kv_quant``'s
conversions, bit for bit)."""

from __future__ import annotations

import torch

from octavo.attention.backend import TorchAttention
from octavo.attention.kv_quant import UNIT_SCALES, KVScales
from octavo.attention.metadata import AttentionMetadata
from octavo.attention.options import FULL_ATTENTION, AttentionOptions

PREFILL_HEAD_SIZES = (64, 80, 96, 128, 256)  # the prefill kernel's compiled head sizes


class NativeCpuAttention(TorchAttention):
    def __init__(self, ops) -> None:
        self.ops = ops  # torch.ops.octavo_cpu

    def prefill(
        self, query, key, value, kv_cache, meta: AttentionMetadata, scale, kv_scales, options
    ) -> list[torch.Tensor]:
        if not native_prefill(query, meta, options):
            return super().prefill(query, key, value, kv_cache, meta, scale, kv_scales, options)
        count, tokens = meta.num_prefills, meta.num_prefill_tokens
        queries = query[:tokens]
        out = torch.empty(queries.shape, dtype=query.dtype, device=query.device)
        self.ops.paged_prefill_attention(
            out,
            queries,
            kv_cache,
            meta.block_tables[:count],
            meta.query_start_loc[: count + 1],
            meta.seq_lens[:count],
            scale,
            kv_scales.k,
            kv_scales.v,
            *native_options(options),
        )
        return [out]

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


def native_prefill(query: torch.Tensor, meta: AttentionMetadata, options) -> bool:
    """Whether the prefill kernel does this step's prefill chunks (else the torch path)."""
    return (
        meta.num_prefills > 0
        and options.chunk_size is None
        and not meta.bidirectional_spans
        and query.shape[-1] in PREFILL_HEAD_SIZES
    )


def native_options(options: AttentionOptions) -> tuple[int, float, torch.Tensor | None]:
    """The kernel's spelling: window 0 and soft-cap 0.0 mean none; sinks float32 or None."""
    sinks = options.sinks
    if sinks is not None:
        sinks = sinks.to(torch.float32).contiguous()
    return options.sliding_window or 0, options.soft_cap or 0.0, sinks
