"""Mixture-of-experts layers: the router, ``FusedMoE`` and checkpoint naming conventions."""

from octavo.model_executor.layers.moe.fused_moe import FusedMoE
from octavo.model_executor.layers.moe.group_limited import GroupLimit, Selection
from octavo.model_executor.layers.moe.names import ExpertNames
from octavo.model_executor.layers.moe.router import TopKRouter

__all__ = [
    "ExpertNames",
    "FusedMoE",
    "GroupLimit",
    "Selection",
    "TopKRouter",
]
