"""Whether an engine keeps one block table per KV cache group (``kv_cache_groups``)."""

from __future__ import annotations

import logging

from octavo.kv_cache.kv_cache_groups import KVCacheGroups, group_layers
from octavo.model_executor.kv_layer_kinds import kv_layer_kinds
from octavo.model_executor.model_config import ModelConfig

logger = logging.getLogger(__name__)


def kv_cache_groups_for(
    config: ModelConfig, pipeline_stages: int, has_draft: bool, has_states: bool
) -> KVCacheGroups | None:
    """The groups of a model whose attention layers mix layouts (sliding and full: Gemma
    2/3, gpt-oss, OLMo 3; chunked local and full: Llama 4), or None: one block table
    serves every layer as before (uniform models; a draft model, which reads the target's
    table; state-layer models; several pipeline stages)."""
    if has_draft or has_states or pipeline_stages > 1:
        return None
    groups = group_layers(kv_layer_kinds(config))
    if groups.is_uniform:
        return None
    logger.info(
        "KV cache groups: %d of %d layers each (%s), sharing %d cache tensors",
        len(groups.groups),
        groups.group_size,
        ", ".join(f"{g.kind.kind} {g.kind.span or ''}".strip() for g in groups.groups),
        groups.group_size,
    )
    return groups
