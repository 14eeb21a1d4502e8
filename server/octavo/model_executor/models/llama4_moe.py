"""Llama 4's mixture of experts, as transformers' ``Llama4TextMoe``: a sigmoid router (top-k
of the logits, each kept logit's sigmoid its score), routed experts that take each token
*scaled by its score* (vLLM's ``apply_router_weight_on_input``; the expert's output is not
weighted), and one always-on shared expert added to their sum.

Checkpoint names (relative to the block): ``router.weight``, ``experts.gate_up_proj [E, H,
2I]`` (each expert's gate columns, then its up columns), ``experts.down_proj [E, I, H]``
and ``shared_experts.{gate,up,down}_proj.weight`` (the model maps transformers'
``shared_expert``). The stacked gate/up tensor is read whole and interleaved into the
layout ``FusedMoE`` loads (gpt-oss's), then each rank keeps its part.
"""

from __future__ import annotations

import torch

from octavo.model_executor.checkpoint_slice import materialize
from octavo.model_executor.layers.moe import ExpertNames
from octavo.model_executor.models.shared_experts import MoEWithSharedExperts

LLAMA4 = ExpertNames(
    router_weight="router.weight",
    fused_gate_up="experts.gate_up_proj",
    fused_down="experts.down_proj",
)


class InputScaledMoE(MoEWithSharedExperts):
    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [T, H]`` → the routed experts' outputs on score-scaled inputs + the
        shared expert's output. Each (token, expert) pair is one row of weight 1."""
        weights, ids = self.routed.router(hidden)
        tokens, top_k = ids.shape
        scaled = hidden[:, None, :] * weights.to(hidden.dtype)[..., None]  # [T, k, H]
        ones = torch.ones(tokens * top_k, 1, dtype=hidden.dtype, device=hidden.device)
        rows = self.routed.experts(scaled.reshape(tokens * top_k, -1), ones, ids.reshape(-1, 1))
        routed = self.routed.tp.all_reduce(rows.view(tokens, top_k, -1).sum(dim=1))
        return routed + self.shared_experts(hidden)

    def load_checkpoint_tensor(self, name: str, tensor) -> list[str]:
        if name == LLAMA4.fused_gate_up:
            tensor = interleave_gate_up(materialize(tensor))
        return super().load_checkpoint_tensor(name, tensor)


def interleave_gate_up(stacked: torch.Tensor) -> torch.Tensor:
    """``[E, H, 2I]`` gate columns then up columns → gate and up interleaved (gate even)."""
    gate, up = stacked.chunk(2, dim=-1)
    return torch.stack([gate, up], dim=-1).flatten(-2)
