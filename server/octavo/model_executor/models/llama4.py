"""Llama 4 text (``Llama4ForCausalLM`` with a ``Llama4TextConfig``), as transformers'
``modeling_llama4``: a pre-norm decoder where

* layers in ``moe_layers`` (every ``interleave_moe_layer_step``-th) are a mixture of
  experts with a shared expert and sigmoid top-k routing that scales each expert's *input*
  by the router score (``llama4_moe``); the others a dense MLP of ``intermediate_size_mlp``;
* rope layers (``no_rope_layers[i] == 1``) rotate adjacent pairs (complex rope, Llama 3
  scaling in the released configs), L2-norm queries and keys (``use_qk_norm``) and attend
  within chunks of ``attention_chunk_size`` (``layer_types`` ``chunked_attention``);
* NoPE layers attend fully, without rope, their queries scaled per position
  (``attn_temperature_tuning``: ``floor_scale``, ``attn_scale``) (``llama4_attention``).

Checkpoint names are Llama's but for the feed-forward block: ``feed_forward.`` (read as
``mlp.``) and its ``shared_expert`` (``shared_experts``).
"""

from __future__ import annotations

import dataclasses
import functools

from torch import nn

from octavo.model_executor.layers.activation import activation_for
from octavo.model_executor.layers.llama4_attention import (
    Llama4Attention,
    Llama4Choices,
    TemperatureTuning,
)
from octavo.model_executor.layers.mlp import GatedMLP
from octavo.model_executor.layers.quantization.registry import linear_method_for
from octavo.model_executor.models.causal_lm import CausalLM
from octavo.model_executor.models.layer_spec import AttentionSpec, LayerSpec
from octavo.model_executor.models.llama4_moe import LLAMA4, InputScaledMoE
from octavo.model_executor.models.moe_mlp import MoEShape, expert_mlp

CHUNKED_ATTENTION = "chunked_attention"


class Llama4ForCausalLM(CausalLM):
    architectures = ("Llama4ForCausalLM",)

    def layer_spec(self, index: int) -> LayerSpec:
        block = functools.partial(self.make_attention, index)
        return dataclasses.replace(super().layer_spec(index), attention_block=block)

    def attention_spec(self, index: int) -> AttentionSpec:
        """Every layer takes the rope table (NoPE layers read its positions only)."""
        hf = self.config.hf
        chunked = hf.layer_types[index] == CHUNKED_ATTENTION
        return dataclasses.replace(
            super().attention_spec(index),
            chunk_size=hf.attention_chunk_size if chunked else None,
        )

    def attention_choices(self, index: int) -> Llama4Choices:
        hf = self.config.hf
        uses_rope = bool(hf.no_rope_layers[index])
        tuned = hf.attn_temperature_tuning and not uses_rope
        return Llama4Choices(
            uses_rope=uses_rope,
            l2_qk_norm=bool(hf.use_qk_norm) and uses_rope,
            norm_eps=self.config.rms_norm_eps,
            temperature=TemperatureTuning(hf.floor_scale, hf.attn_scale) if tuned else None,
        )

    def make_attention(self, index: int) -> nn.Module:
        method = functools.partial(linear_method_for, self.quantization)
        spec, choices = self.attention_spec(index), self.attention_choices(index)
        return Llama4Attention(self.config.hidden_size, spec, choices, method)

    def make_mlp(self, index: int) -> nn.Module:
        hf = self.config.hf
        method = functools.partial(linear_method_for, self.quantization)
        activation = activation_for(hf.hidden_act)
        if index not in hf.moe_layers:
            return GatedMLP(self.config.hidden_size, hf.intermediate_size_mlp, activation, method)
        shape = MoEShape(
            num_experts=hf.num_local_experts,
            top_k=hf.num_experts_per_tok,
            intermediate_size=hf.intermediate_size,
            renormalize=False,
            weights_in_model_dtype=True,
            router="sigmoid",
        )
        shared = GatedMLP(self.config.hidden_size, hf.intermediate_size, activation, method)
        return InputScaledMoE(expert_mlp(self, LLAMA4, shape), shared)

    @classmethod
    def checkpoint_name(cls, name: str) -> str | None:
        name = name.replace(".feed_forward.shared_expert.", ".mlp.shared_experts.")
        return name.replace(".feed_forward.", ".mlp.")
