"""DeepSeek-V2 (V2-Lite) and DeepSeek-V3 (R1, Kimi K2): multi-head latent attention
(``layers/mla_attention``) and DeepSeekMoE, as transformers' ``modeling_deepseek_v2`` /
``modeling_deepseek_v3``.

* every layer attends with MLA; its cache holds ``kv_lora_rank + qk_rope_head_dim``
  values per token (``ModelConfig.kv_latent_dim``); rope covers the ``qk_rope_head_dim``
  dims (YaRN's ``mscale_all_dim`` also scales the softmax: ``rotary.mla_softmax_scale``);
* layers below ``first_k_dense_replace`` keep a dense MLP; the others (every
  ``moe_layer_freq``-th, as vLLM reads it; transformers ignores the key, 1 in every
  released config) are routed experts beside ``n_shared_experts`` shared ones;
* V2's router: softmax, top-k (``topk_method`` ``greedy``, or ``group_limited_greedy``
  over ``n_group`` groups scored by their best expert), times ``routed_scaling_factor``,
  never renormalised (transformers' V2 ignores ``norm_topk_prob``);
* V3's router: sigmoid, the ``e_score_correction_bias`` added for the choice only, groups
  scored by their two best experts, renormalised when ``norm_topk_prob``, scaled;
  its rope pairs adjacent dims when ``rope_interleave`` (V2's always does).

FP8 block checkpoints (V3/R1, Kimi K2; ``layers/quantization/fp8_blocks.py``) keep every
projection and expert in FP8 except ``kv_b_proj``: dequantized at load (its layer has no
quantized method), since the absorbed decode reads its per-head blocks as floats.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from torch import nn

from octavo.model_executor.layers.activation import SiluAndMul
from octavo.model_executor.layers.mla_attention import MLAAttention, MLASpec
from octavo.model_executor.layers.mlp import GatedMLP
from octavo.model_executor.layers.moe import ExpertNames, GroupLimit, Selection
from octavo.model_executor.layers.quantization.registry import linear_method_for
from octavo.model_executor.models.causal_lm import CausalLM
from octavo.model_executor.models.layer_spec import AttentionSpec, LayerSpec
from octavo.model_executor.models.moe_mlp import MoEShape, expert_mlp
from octavo.model_executor.models.shared_experts import MoEWithSharedExperts
from octavo.model_executor.rotary import RotaryEmbedding, mla_softmax_scale


class DeepseekV2ForCausalLM(CausalLM):
    architectures = ("DeepseekV2ForCausalLM",)
    router_kind = "softmax"
    expert_names = ExpertNames(  # V3's router also has its e_score_correction_bias [E]
        router_weight="gate.weight",
        router_score_bias="gate.e_score_correction_bias",
        gate="experts.{e}.gate_proj.weight",
        up="experts.{e}.up_proj.weight",
        down="experts.{e}.down_proj.weight",
    )

    def layer_spec(self, index: int) -> LayerSpec:
        block = functools.partial(self.make_attention, index)
        return dataclasses.replace(super().layer_spec(index), attention_block=block)

    def mla_spec(self) -> MLASpec:
        hf = self.config.hf
        return MLASpec(
            num_heads=self.config.num_heads,
            q_lora_rank=hf.q_lora_rank,
            kv_lora_rank=hf.kv_lora_rank,
            qk_nope_head_dim=hf.qk_nope_head_dim,
            qk_rope_head_dim=hf.qk_rope_head_dim,
            v_head_dim=hf.v_head_dim,
            scale=mla_softmax_scale(hf.qk_nope_head_dim + hf.qk_rope_head_dim, self.config.rope),
            rope_interleaved=self.rope_interleaved(),
            bias=bool(getattr(hf, "attention_bias", False)),
        )

    def rope_interleaved(self) -> bool:
        return True  # V2 rotates adjacent pairs (complex multiplication)

    def attention_spec(self, index: int) -> AttentionSpec:
        """What the shared code reads of a layer's attention: its heads and rope table."""
        spec = self.mla_spec()
        return AttentionSpec(spec.num_heads, 1, spec.latent_dim, scale=spec.scale)

    def make_attention(self, index: int) -> nn.Module:
        method = functools.partial(linear_method_for, self.quantization)
        return MLAAttention(self.config.hidden_size, self.mla_spec(), method)

    def set_rotary(self, max_positions: int, dtype: torch.dtype, device: torch.device) -> None:
        rope_dim = self.config.hf.qk_rope_head_dim  # the roped part of each head
        self.rotary = {
            name: RotaryEmbedding(rope_dim, max_positions, rope, dtype, device)
            for name, rope in self.rope_parameters().items()
        }

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

    @classmethod
    def checkpoint_name(cls, name: str) -> str | None:
        # A full-rank q_proj is not Llama's Q of a fused Q/K/V: its own module here.
        return name.replace(".self_attn.q_proj.", ".self_attn.q_full_proj.")


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    architectures = ("DeepseekV3ForCausalLM",)
    router_kind = "sigmoid"

    def rope_interleaved(self) -> bool:
        return bool(getattr(self.config.hf, "rope_interleave", True))

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
