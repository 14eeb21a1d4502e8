"""GLM-4.5 / GLM-4.6 (``Glm4MoeForCausalLM``): grouped-query attention in front of
DeepSeek-V3's mixture of experts, as transformers' ``modeling_glm4_moe``.

* attention is Llama's with biases on Q/K/V only (``attention_bias``; the output
  projection never has one), a per-head RMSNorm on queries and keys when ``use_qk_norm``,
  and rope over the first ``partial_rotary_factor`` of each head (transformers' default
  0.5 where the config leaves it out);
* the feed-forward blocks are DeepSeek-V3's (``deepseek_v2.DeepseekV3ForCausalLM``'s hooks,
  reused whole): dense below ``first_k_dense_replace``, then ``n_routed_experts`` routed
  experts beside ``n_shared_experts`` shared ones; sigmoid scores, the
  ``e_score_correction_bias`` for the choice only, group-limited top-k (``n_group`` /
  ``topk_group``, groups scored by their two best experts), renormalised when
  ``norm_topk_prob``, times ``routed_scaling_factor``;
* the multi-token-prediction layer a checkpoint stores after the last layer is not loaded.
"""

from __future__ import annotations

import dataclasses

import torch

from octavo.model_executor.model_config import FULL_ATTENTION
from octavo.model_executor.models.causal_lm import CausalLM
from octavo.model_executor.models.deepseek_v2 import DeepseekV3ForCausalLM
from octavo.model_executor.models.layer_spec import AttentionSpec, LayerSpec
from octavo.model_executor.rotary import rope_parameters_for


class Glm4MoeForCausalLM(DeepseekV3ForCausalLM):
    """DeepSeek-V3's MoE hooks; the attention hooks go back to ``CausalLM``'s (no MLA)."""

    architectures = ("Glm4MoeForCausalLM",)

    def layer_spec(self, index: int) -> LayerSpec:
        return CausalLM.layer_spec(self, index)

    def attention_spec(self, index: int) -> AttentionSpec:
        qk_norm = "head" if getattr(self.config.hf, "use_qk_norm", False) else None
        return dataclasses.replace(CausalLM.attention_spec(self, index), qk_norm=qk_norm)

    def o_proj_bias(self) -> bool:
        return False

    def rope_parameters(self) -> dict[str, dict]:
        """transformers' rope settings, ``partial_rotary_factor`` defaulted to 0.5."""
        return {FULL_ATTENTION: rope_parameters_for(self.config.hf.to_dict())}

    def set_rotary(self, max_positions: int, dtype: torch.dtype, device: torch.device) -> None:
        CausalLM.set_rotary(self, max_positions, dtype, device)

    @classmethod
    def checkpoint_name(cls, name: str) -> str | None:
        return name  # Llama's names: q_proj is one of the fused Q/K/V
