"""MiniMax-M2 (``MiniMaxM2ForCausalLM``): Mixtral's decoder with a mixture of experts in
every layer, as transformers' ``modeling_minimax_m2``.

* one RMSNorm over the whole query and the whole key projection (all heads together,
  OLMo 2's ``qk_norm="full"``; summed over the ranks under tensor parallelism) before rope;
* rope over the first ``rotary_dim`` dimensions of each head (transformers turns the
  config's ``rotary_dim`` into ``partial_rotary_factor``);
* the router (``block_sparse_moe.gate``, in the model's dtype) scores experts with a
  sigmoid, picks the top-k of the scores plus ``block_sparse_moe.e_score_correction_bias``
  and weighs them by the unbiased scores, renormalised to sum to 1 (DeepSeek-V3's
  sigmoid router without groups or scaling); experts are Mixtral's ``w1``/``w3``/``w2``.
"""

from __future__ import annotations

import dataclasses

from octavo.model_executor.layers.moe import Selection
from octavo.model_executor.model_config import FULL_ATTENTION
from octavo.model_executor.models.layer_spec import AttentionSpec
from octavo.model_executor.models.mixtral import MixtralForCausalLM
from octavo.model_executor.models.moe_mlp import MoEShape
from octavo.model_executor.rope_parameters import rope_parameters_for


class MiniMaxM2ForCausalLM(MixtralForCausalLM):
    architectures = ("MiniMaxM2ForCausalLM",)
    # Mixtral's expert names, and the correction bias on the block itself (not the router)
    expert_names = dataclasses.replace(
        MixtralForCausalLM.expert_names, router_score_bias="e_score_correction_bias"
    )

    def attention_spec(self, index: int) -> AttentionSpec:
        return dataclasses.replace(super().attention_spec(index), qk_norm="full")

    def rope_parameters(self) -> dict[str, dict]:
        """transformers' rope settings (``rotary_dim`` read as ``partial_rotary_factor``)."""
        return {FULL_ATTENTION: rope_parameters_for(self.config.hf.to_dict())}

    def moe_shape(self) -> MoEShape:
        """Mixtral's, with the sigmoid router and the correction bias."""
        return dataclasses.replace(
            super().moe_shape(), router="sigmoid", selection=Selection(correction_bias=True)
        )
