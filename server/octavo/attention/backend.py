"""Attention backends: one call per layer stores the step's keys/values and attends."""

from __future__ import annotations

from typing import Protocol

import torch

from octavo.attention import encoder_attention, torch_ops
from octavo.attention.kv_quant import UNIT_SCALES, KVScales, stored
from octavo.attention.metadata import AttentionMetadata
from octavo.attention.options import FULL_ATTENTION, AttentionOptions


class AttentionBackend(Protocol):
    def forward(
        self,
        query: torch.Tensor,  # [T, heads, head_dim]
        key: torch.Tensor,  # [T, kv_heads, head_dim]
        value: torch.Tensor,  # [T, kv_heads, head_dim]
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, kv_heads, head_dim]
        meta: AttentionMetadata,
        scale: float,
        kv_scales: KVScales = UNIT_SCALES,  # the layer's fp8 cache scales (kv_quant)
        options: AttentionOptions = FULL_ATTENTION,  # the layer's window, soft-cap, sinks
    ) -> torch.Tensor:  # [T, heads, head_dim]
        ...


class TorchAttention:
    """CPU path: a loop over prefill chunks and one batched, masked call for all decodes."""

    def forward(
        self,
        query,
        key,
        value,
        kv_cache,
        meta: AttentionMetadata,
        scale: float,
        kv_scales: KVScales = UNIT_SCALES,
        options: AttentionOptions = FULL_ATTENTION,
    ):
        if meta.encoder_only and encoder_attention.handles(options):
            lengths = meta.query_lens_list
            return encoder_attention.encoder_attention(query, key, value, lengths, scale, options)
        self.store(key, value, kv_cache, meta, kv_scales)
        outputs = self.prefill(query, key, value, kv_cache, meta, scale, kv_scales, options)
        if meta.num_decodes:
            decodes = query[meta.num_prefill_tokens :]
            outputs.append(self.decode(decodes, kv_cache, meta, scale, kv_scales, options))
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs)

    def store(self, key, value, kv_cache, meta: AttentionMetadata, kv_scales: KVScales) -> None:
        torch_ops.store_kv(key, value, kv_cache, meta.slot_mapping, False, kv_scales)

    def prefill(
        self, query, key, value, kv_cache, meta: AttentionMetadata, scale, kv_scales, options
    ) -> list[torch.Tensor]:
        """The outputs of the step's prefill chunks (a list to concatenate; [] for none)."""
        return [
            self._prefill(i, query, key, value, kv_cache, meta, scale, kv_scales, options)
            for i in range(meta.num_prefills)
        ]

    @staticmethod
    def _prefill(
        index, query, key, value, kv_cache, meta, scale, kv_scales, options
    ) -> torch.Tensor:
        start = meta.query_start_loc_list[index]
        end = start + meta.query_lens_list[index]
        seq_len = meta.seq_lens_list[index]
        spans = meta.bidirectional_spans[index] if meta.bidirectional_spans else ()
        if end - start == seq_len:  # no cached prefix: the fresh keys, as the cache holds them
            key = stored(key[start:end], kv_scales.k, kv_cache.dtype)
            value = stored(value[start:end], kv_scales.v, kv_cache.dtype)
            return torch_ops.causal_attention(
                query[start:end], key, value, scale, kv_scales, options, spans
            )
        table = meta.block_tables[index]
        return torch_ops.prefill_attention(
            query[start:end], kv_cache, table, seq_len, scale, kv_scales, options, spans
        )

    def decode(
        self,
        query,
        kv_cache,
        meta: AttentionMetadata,
        scale: float,
        kv_scales: KVScales = UNIT_SCALES,
        options: AttentionOptions = FULL_ATTENTION,
    ) -> torch.Tensor:
        """The decoding sequences' single queries ``[num_decodes, heads, head_dim]``."""
        window, chunk = options.sliding_window, options.chunk_size
        key = ("decode_plan", window) if chunk is None else ("decode_plan", window, chunk)
        plan = meta.backend_cache.get(key)
        if plan is None:  # same for every layer with this window: derive once per step
            first = meta.num_prefills
            plan = torch_ops.decode_gather_plan(
                meta.block_tables[first:],
                meta.seq_lens[first:],
                kv_cache.shape[2],
                query.dtype,
                window,
                chunk,
            )
            meta.backend_cache[key] = plan
        slots, mask = plan
        return torch_ops.grouped_decode_attention(
            query, kv_cache, slots, mask, scale, kv_scales, options
        )


def check_backend(name: str, device: torch.device, block_size: int, dtype: torch.dtype) -> None:
    """ValueError where ``--attention-backend`` cannot run with this device and cache."""
    if name == "TRITON_ATTN" and device.type != "cuda":
        raise ValueError("attention_backend TRITON_ATTN runs on CUDA GPUs only (CPU: auto)")
    if name == "CPU_ATTN" and device.type != "cpu":
        raise ValueError("attention_backend CPU_ATTN runs on CPUs only (GPU: auto)")
    if name == "FLASH_ATTN":
        from octavo.attention.flash_backend import check_flash_attention

        check_flash_attention(device, block_size, dtype)


def select_backend(
    device: torch.device, dtype: torch.dtype, name: str = "auto", max_positions: int = 0
) -> AttentionBackend:
    """``--attention-backend``'s kernels (``auto``: this device's own); ``max_positions``:
    the longest context a captured CUDA graph may replay (FLASH_ATTN's planning length)."""
    if name == "FLASH_ATTN":
        from octavo.attention.flash_backend import FlashAttention

        return FlashAttention(max_positions)
    if device.type == "cuda":
        from octavo.attention.triton_backend import TritonAttention

        return TritonAttention()
    from octavo.kernels.cpu_build import native_ops

    ops = native_ops(device, dtype)
    if ops is not None:
        from octavo.attention.cpu_native import NativeCpuAttention

        return NativeCpuAttention(ops)
    return TorchAttention()
