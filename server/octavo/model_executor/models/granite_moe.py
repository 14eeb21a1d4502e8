"""Granite's feed-forward block (GraniteMoE-shared / Granite 4.0): a shared gated MLP that
every token goes through, plus, when the config has experts, routed experts whose outputs
are added to it, as transformers' ``GraniteMoeHybridDecoderLayer`` sums them.

Checkpoint names (relative to the layer, put under ``mlp.`` by the model):

* ``shared_mlp.input_linear.weight [2 S, H]`` (gate rows, then up rows) and
  ``shared_mlp.output_linear.weight [H, S]``;
* ``block_sparse_moe.router.layer.weight [E, H]``; the experts stacked,
  ``block_sparse_moe.input_linear.weight [E, 2 I, H]`` (each expert's gate rows, then up
  rows) and ``block_sparse_moe.output_linear.weight [E, H, I]``, handed to the
  ``FusedMoE`` one expert at a time (only this rank's experts are read).
"""

from __future__ import annotations

import torch
from torch import nn

from octavo.model_executor.checkpoint_slice import RowRange
from octavo.model_executor.layers.mlp import GatedMLP
from octavo.model_executor.layers.moe import ExpertNames, FusedMoE

GRANITE_MOE = ExpertNames(
    router_weight="router.layer.weight",
    gate="experts.{e}.gate",  # filled from the stacked input_linear (see GraniteMoE)
    up="experts.{e}.up",
    down="experts.{e}.down",
)
ROUTED, SHARED = "block_sparse_moe.", "shared_mlp."
SHARED_KEYS = {SHARED + "input_linear.weight", SHARED + "output_linear.weight"}


class GraniteMoE(nn.Module):
    def __init__(self, shared: GatedMLP, routed: FusedMoE | None) -> None:
        super().__init__()
        self.shared_mlp, self.routed = shared, routed

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [T, H]`` → shared MLP's output (+ the routed experts')."""
        shared = self.shared_mlp(hidden)
        return shared if self.routed is None else self.routed(hidden) + shared

    def load_checkpoint_tensor(self, name: str, tensor) -> list[str]:
        """Copy one checkpoint tensor (name relative to the layer); the keys it filled."""
        if name == SHARED + "input_linear.weight":
            gate_up = self.shared_mlp.gate_up
            size = gate_up.total_output_sizes[0]
            for shard_id in (0, 1):
                part = RowRange(tensor, shard_id * size, size)
                gate_up.weight_loader(gate_up.weight, part, f"{name}[{shard_id}]", shard_id)
            return [name]
        if name == SHARED + "output_linear.weight":
            down = self.shared_mlp.down_proj
            down.weight_loader(down.weight, tensor, name)
            return [name]
        if self.routed is None or not name.startswith(ROUTED):
            return []
        return self.load_routed(name.removeprefix(ROUTED), tensor)

    def load_routed(self, name: str, tensor) -> list[str]:
        if name == GRANITE_MOE.router_weight:
            return self.routed.load_checkpoint_tensor(name, tensor)
        placement, filled = self.routed.placement, []
        for expert in placement.local_experts:
            rows = tensor.narrow(0, expert, 1)[0]
            if name == "input_linear.weight":
                gate, up = rows.chunk(2, dim=0)
                filled += self.routed.load_checkpoint_tensor(f"experts.{expert}.gate", gate)
                filled += self.routed.load_checkpoint_tensor(f"experts.{expert}.up", up)
            elif name == "output_linear.weight":
                filled += self.routed.load_checkpoint_tensor(f"experts.{expert}.down", rows)
        return filled

    def expected_keys(self) -> set[str]:
        routed = set() if self.routed is None else self.routed.expected_keys()
        return SHARED_KEYS | routed
