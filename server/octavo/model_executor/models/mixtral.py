"""Mixtral: Mistral's decoder (a sliding window on every layer when the config sets one)
with a mixture of experts in every layer. The checkpoint names the block
``block_sparse_moe`` (router ``gate``, experts ``w1`` gate / ``w3`` up / ``w2`` down); the
top-k routing weights always sum to 1."""

from __future__ import annotations

from torch import nn

from octavo.model_executor.gguf_layout import GgufLayout
from octavo.model_executor.layers.moe import ExpertNames
from octavo.model_executor.models.causal_lm import CausalLM
from octavo.model_executor.models.moe_mlp import MoEShape, expert_mlp


class MixtralForCausalLM(CausalLM):
    architectures = ("MixtralForCausalLM",)
    gguf_layout = GgufLayout(  # llama.cpp writes it as a Llama with experts
        "llama",
        permuted_qk=True,
        moe_block="block_sparse_moe",
        model_type="mixtral",
        config_keys={
            "expert_count": "num_local_experts",
            "expert_used_count": "num_experts_per_tok",
        },
    )
    # the MoE block's checkpoint names (under ``mlp.`` once ``checkpoint_name`` renamed it)
    expert_names = ExpertNames(
        router_weight="gate.weight",
        gate="experts.{e}.w1.weight",
        up="experts.{e}.w3.weight",
        down="experts.{e}.w2.weight",
    )

    def make_mlp(self, index: int) -> nn.Module:
        return expert_mlp(self, self.expert_names, self.moe_shape())

    def moe_shape(self) -> MoEShape:
        hf = self.config.hf
        return MoEShape(
            num_experts=hf.num_local_experts,
            top_k=hf.num_experts_per_tok,
            intermediate_size=self.config.intermediate_size,
            renormalize=True,
            weights_in_model_dtype=False,
        )

    @classmethod
    def checkpoint_name(cls, name: str) -> str | None:
        return name.replace(".block_sparse_moe.", ".mlp.")
