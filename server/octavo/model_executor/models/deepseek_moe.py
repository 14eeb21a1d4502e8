"""DeepSeekMoE's feed-forward blocks as model-class hooks, for DeepSeek-V2/V3 and the
families that took V3's router (GLM-4.5): layers below ``first_k_dense_replace`` keep a
dense MLP; the others (every ``moe_layer_freq``-th, as vLLM reads it) are routed experts
beside ``n_shared_experts`` shared ones.

* V2's router: softmax, top-k (``topk_method`` ``greedy``, or ``group_limited_greedy``
  over ``n_group`` groups scored by their best expert), times ``routed_scaling_factor``,
  never renormalised (transformers' V2 ignores ``norm_topk_prob``);
* V3's router: sigmoid, the ``e_score_correction_bias`` added for the choice only, groups
  scored by their two best experts, renormalised when ``norm_topk_prob``, scaled.
"""

from __future__ import annotations

import functools

from torch import nn

from octavo.model_executor.layers.activation import SiluAndMul
from octavo.model_executor.layers.mlp import GatedMLP
from octavo.model_executor.layers.moe import ExpertNames, GroupLimit, Selection
from octavo.model_executor.layers.quantization.registry import linear_method_for
from octavo.model_executor.models.moe_mlp import MoEShape, expert_mlp
from octavo.model_executor.models.shared_experts import MoEWithSharedExperts


class DeepseekV2MoE:
    """Mixed in before ``CausalLM``: its ``make_mlp`` for the dense layers."""

    router_kind = "softmax"
    expert_names = ExpertNames(  # V3's router also has its e_score_correction_bias [E]
        router_weight="gate.weight",
        router_score_bias="gate.e_score_correction_bias",
        gate="experts.{e}.gate_proj.weight",
        up="experts.{e}.up_proj.weight",
        down="experts.{e}.down_proj.weight",
    )

    def is_sparse(self, index: int) -> bool:
        hf = self.config.hf
        frequency = getattr(hf, "moe_layer_freq", None) or 1
        routed = getattr(hf, "n_routed_experts", None)
        return bool(routed) and index >= hf.first_k_dense_replace and index % frequency == 0

    def make_mlp(self, index: int) -> nn.Module:
        if not self.is_sparse(index):
            return super().make_mlp(index)
        hf = self.config.hf
        shape = MoEShape(
            num_experts=hf.n_routed_experts,
            top_k=hf.num_experts_per_tok,
            intermediate_size=hf.moe_intermediate_size,
            renormalize=self.renormalize(),
            weights_in_model_dtype=False,
            router=self.router_kind,
            selection=self.selection(),
        )
        method = functools.partial(linear_method_for, self.quantization)
        shared_size = hf.moe_intermediate_size * hf.n_shared_experts
        shared = GatedMLP(self.config.hidden_size, shared_size, SiluAndMul(), method)
        return MoEWithSharedExperts(expert_mlp(self, self.expert_names, shape), shared)

    def renormalize(self) -> bool:
        return False

    def selection(self) -> Selection:
        hf = self.config.hf
        groups = None
        if hf.topk_method == "group_limited_greedy":
            groups = GroupLimit(hf.n_group, hf.topk_group, "max")
        return Selection(
            group_limit=groups,
            scaling_factor=float(hf.routed_scaling_factor),
            float32_logits=True,
        )


class DeepseekV3MoE(DeepseekV2MoE):
    router_kind = "sigmoid"

    def renormalize(self) -> bool:
        return bool(self.config.hf.norm_topk_prob)

    def selection(self) -> Selection:
        hf = self.config.hf
        return Selection(
            group_limit=GroupLimit(hf.n_group or 1, hf.topk_group or 1, "top2_sum"),
            correction_bias=True,
            scaling_factor=float(hf.routed_scaling_factor),
            float32_logits=True,
        )
