"""Each layer's KV layout from a model's config, for grouping its KV cache
(``kv_cache.kv_cache_groups``): full attention, a sliding window, or chunked local
attention (Llama 4's ``chunked_attention`` layers); None for a layer without keys and
values (a state layer: a convolution, Mamba or DeltaNet mixer)."""

from __future__ import annotations

from octavo.kv_cache.kv_cache_groups import CHUNKED, FULL, SLIDING, KVLayerKind
from octavo.model_executor.model_config import FULL_ATTENTION, SLIDING_ATTENTION, ModelConfig

CHUNKED_ATTENTION = "chunked_attention"


def kv_layer_kinds(config: ModelConfig) -> list[KVLayerKind | None]:
    return [_kind_of(config, layer) for layer in range(config.num_layers)]


def _kind_of(config: ModelConfig, layer: int) -> KVLayerKind | None:
    layer_type = config.layer_types[layer] if config.layer_types else FULL_ATTENTION
    if layer_type == SLIDING_ATTENTION:
        window = config.window_of(layer)
        return KVLayerKind(SLIDING, window) if window else KVLayerKind(FULL)
    if layer_type == CHUNKED_ATTENTION:
        chunk = getattr(config.hf, "attention_chunk_size", None)
        return KVLayerKind(CHUNKED, chunk) if chunk else KVLayerKind(FULL)
    if layer_type in (FULL_ATTENTION, "attention"):
        return KVLayerKind(FULL)
    return None  # "conv", "mamba", "linear_attention": state layers
