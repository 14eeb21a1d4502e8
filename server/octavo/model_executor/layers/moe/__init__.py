"""Mixture-of-experts layers: the router, ``FusedMoE`` and checkpoint naming conventions."""

from octavo.model_executor.layers.moe.fused_moe import FusedMoE
from octavo.model_executor.layers.moe.group_limited import GroupLimit, Selection
from octavo.model_executor.layers.moe.names import (
    DEEPSEEK,
    GPT_OSS,
    MIXTRAL,
    QWEN_MOE,
    ExpertNames,
)
from octavo.model_executor.layers.moe.router import TopKRouter

__all__ = [
    "DEEPSEEK",
    "GPT_OSS",
    "MIXTRAL",
    "QWEN_MOE",
    "ExpertNames",
    "FusedMoE",
    "GroupLimit",
    "Selection",
    "TopKRouter",
]
