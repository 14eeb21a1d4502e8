"""GLM-4.5 / GLM-4.6 (``Glm4MoeForCausalLM``): grouped-query attention in front of
DeepSeek-V3's mixture of experts, as transformers' ``modeling_glm4_moe``.

* attention is Llama's with biases on Q/K/V only (``attention_bias``; the output
  projection never has one), a per-head RMSNorm on queries and keys when ``use_qk_norm``,
  and rope over the first ``partial_rotary_factor`` of each head (transformers' default
  0.5 where the config leaves it out);
* the feed-forward blocks are DeepSeek-V3's (``deepseek_moe.DeepseekV3MoE``'s hooks,
  reused whole): dense below ``first_k_dense_replace``, then ``n_routed_experts`` routed
  experts beside ``n_shared_experts`` shared ones; sigmoid scores, the
  ``e_score_correction_bias`` for the choice only, group-limited top-k (``n_group`` /
  ``topk_group``, groups scored by their two best experts), renormalised when
  ``norm_topk_prob``, times ``routed_scaling_factor``;
* the multi-token-prediction layer a checkpoint stores after the last layer is not loaded.
"""

from __future__ import annotations

import dataclasses

from octavo.model_executor.model_config import FULL_ATTENTION
from octavo.model_executor.models.causal_lm import CausalLM
from octavo.model_executor.models.deepseek_moe import DeepseekV3MoE
from octavo.model_executor.models.layer_spec import AttentionSpec
from octavo.model_executor.rope_parameters import rope_parameters_for


class Glm4MoeForCausalLM(DeepseekV3MoE, CausalLM):
    """DeepSeek-V3's MoE hooks over ``CausalLM``'s grouped-query attention."""

    architectures = ("Glm4MoeForCausalLM",)

    def attention_spec(self, index: int) -> AttentionSpec:
        qk_norm = "head" if getattr(self.config.hf, "use_qk_norm", False) else None
        return dataclasses.replace(super().attention_spec(index), qk_norm=qk_norm)

    def o_proj_bias(self) -> bool:
        return False

    def rope_parameters(self) -> dict[str, dict]:
        """transformers' rope settings, ``partial_rotary_factor`` defaulted to 0.5."""
        return {FULL_ATTENTION: rope_parameters_for(self.config.hf.to_dict())}
