"""A mixture of experts beside always-on shared experts (DeepSeekMoE): every token goes
through the routed experts (a ``FusedMoE``) and through one dense gated MLP, and the two
outputs are summed, as transformers' ``DeepseekV2Moe`` / ``DeepseekV3MoE`` do.

Checkpoint names (relative to the block): the routed experts' own (``gate.weight``,
``experts.{e}.*``) and ``shared_experts.{gate,up,down}_proj.weight``.
"""

from __future__ import annotations

import torch
from torch import nn

from octavo.model_executor.layers.mlp import GatedMLP
from octavo.model_executor.layers.moe import FusedMoE

SHARED = "shared_experts."
_SHARED_SLOTS = {  # checkpoint name under shared_experts. -> (GatedMLP linear, shard id)
    "gate_proj.weight": ("gate_up", 0),
    "up_proj.weight": ("gate_up", 1),
    "down_proj.weight": ("down_proj", None),
}


class MoEWithSharedExperts(nn.Module):
    def __init__(self, routed: FusedMoE, shared: GatedMLP) -> None:
        super().__init__()
        self.routed, self.shared_experts = routed, shared

    @property
    def router(self) -> nn.Module:
        return self.routed.router

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [T, H]`` → routed experts' output + shared experts' output."""
        return self.routed(hidden) + self.shared_experts(hidden)

    def load_checkpoint_tensor(self, name: str, tensor) -> list[str]:
        """Copy one checkpoint tensor (name relative to the block); the keys it filled."""
        if not name.startswith(SHARED):
            return self.routed.load_checkpoint_tensor(name, tensor)
        part = name.removeprefix(SHARED)
        if part not in _SHARED_SLOTS:
            return []
        attribute, shard = _SHARED_SLOTS[part]
        linear = getattr(self.shared_experts, attribute)
        if shard is None:
            linear.weight_loader(linear.weight, tensor, name)
        else:
            linear.weight_loader(linear.weight, tensor, name, shard)
        return [name]

    def expected_keys(self) -> set[str]:
        shared = {SHARED + part for part in _SHARED_SLOTS}
        return self.routed.expected_keys() | shared
