"""GPU attention backend: the Triton kernels behind the ``AttentionBackend`` protocol."""

from __future__ import annotations

import torch

from octavo.attention import encoder_attention, triton_decode, triton_kernels
from octavo.attention.backend import TorchAttention
from octavo.attention.kv_quant import UNIT_SCALES, KVScales
from octavo.attention.metadata import AttentionMetadata
from octavo.attention.options import FULL_ATTENTION, AttentionOptions


class TritonAttention:
    """Stores the step's keys/values, then one prefill launch and one decode launch."""

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        kv_scales: KVScales = UNIT_SCALES,
        options: AttentionOptions = FULL_ATTENTION,
    ) -> torch.Tensor:
        """Attention output ``[T, heads, head_dim]``: prefill tokens first, then decodes.

        ``options``: the layer's sliding window, soft-cap and sinks (both launches)."""
        if meta.encoder_only and encoder_attention.handles(options):
            lengths = meta.query_lens_list
            return encoder_attention.encoder_attention(query, key, value, lengths, scale, options)
        triton_kernels.store_kv(key, value, kv_cache, meta.slot_mapping, kv_scales)
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
        split = meta.num_prefill_tokens
        if meta.bidirectional_spans:  # the kernel is causal only: such chunks take torch's
            for index in range(meta.num_prefills):
                start = meta.query_start_loc_list[index]
                out[start : start + meta.query_lens_list[index]] = TorchAttention._prefill(
                    index, query, key, value, kv_cache, meta, scale, kv_scales, options
                )
        elif meta.num_prefills:
            self._prefill(query[:split], kv_cache, meta, scale, out[:split], kv_scales, options)
        if meta.num_decodes:
            first = meta.num_prefills
            triton_decode.paged_decode_attention(
                query[split:],
                kv_cache,
                meta.block_tables[first:],
                meta.seq_lens[first:],
                max(meta.seq_lens_list[first:]),
                scale,
                out=out[split:],
                scales=kv_scales,
                options=options,
            )
        return out

    @staticmethod
    def _prefill(
        query: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        out: torch.Tensor,
        kv_scales: KVScales,
        options: AttentionOptions,
    ) -> None:
        """All prefill chunks (sequences ``[0, num_prefills)``) in one kernel launch."""
        count = meta.num_prefills
        triton_kernels.prefill_attention(
            query,
            kv_cache,
            meta.block_tables[:count],
            meta.query_start_loc[: count + 1],
            meta.seq_lens[:count],
            max(meta.query_lens_list[:count]),
            scale,
            out=out,
            scales=kv_scales,
            options=options,
        )
