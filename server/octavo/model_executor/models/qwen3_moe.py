"""Qwen 3 MoE: Qwen 3's attention (per-head Q/K norms) with a mixture of experts as the
feed-forward block of every ``decoder_sparse_step``-th layer not in ``mlp_only_layers``
(those keep a dense MLP of ``intermediate_size``). The router is ``mlp.gate``; its top-k
weights are renormalised when ``norm_topk_prob``."""

from __future__ import annotations

from torch import nn

from octavo.model_executor.gguf_layout import GgufLayout
from octavo.model_executor.layers.moe import ExpertNames
from octavo.model_executor.models.moe_mlp import MoEShape, expert_mlp
from octavo.model_executor.models.qwen3 import Qwen3ForCausalLM


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    architectures = ("Qwen3MoeForCausalLM",)
    gguf_layout = GgufLayout("qwen3moe", moe_block="mlp")
    expert_names = ExpertNames(  # one tensor per expert and projection, under ``mlp.``
        router_weight="gate.weight",
        gate="experts.{e}.gate_proj.weight",
        up="experts.{e}.up_proj.weight",
        down="experts.{e}.down_proj.weight",
    )

    def is_sparse(self, index: int) -> bool:
        hf = self.config.hf
        step = getattr(hf, "decoder_sparse_step", 1) or 1
        return (
            index not in (getattr(hf, "mlp_only_layers", None) or [])
            and hf.num_experts > 0
            and (index + 1) % step == 0
        )

    def make_mlp(self, index: int) -> nn.Module:
        if not self.is_sparse(index):
            return super().make_mlp(index)
        hf = self.config.hf
        shape = MoEShape(
            num_experts=hf.num_experts,
            top_k=hf.num_experts_per_tok,
            intermediate_size=hf.moe_intermediate_size,
            renormalize=bool(hf.norm_topk_prob),
            weights_in_model_dtype=True,
        )
        return expert_mlp(self, self.expert_names, shape)
