"""DeepSeek-V2 (V2-Lite) and DeepSeek-V3 (R1, Kimi K2): multi-head latent attention
(``layers/mla_attention``) and DeepSeekMoE, as transformers' ``modeling_deepseek_v2`` /
``modeling_deepseek_v3``.

* every layer attends with MLA; its cache holds ``kv_lora_rank + qk_rope_head_dim``
  values per token (``ModelConfig.kv_latent_dim``); rope covers the ``qk_rope_head_dim``
  dims (YaRN's ``mscale_all_dim`` also scales the softmax: ``rotary.mla_softmax_scale``);
* the feed-forward blocks are DeepSeekMoE's (``deepseek_moe``: V2's softmax router, V3's
  sigmoid one with the correction bias); V3's rope pairs adjacent dims when
  ``rope_interleave`` (V2's always does).

FP8 block checkpoints (V3/R1, Kimi K2; ``layers/quantization/fp8_blocks.py``) keep every
projection and expert in FP8 except ``kv_b_proj``: dequantized at load (its layer has no
quantized method), since the absorbed decode reads its per-head blocks as floats.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from torch import nn

from octavo.model_executor.layers.mla_attention import MLAAttention, MLASpec
from octavo.model_executor.layers.quantization.registry import linear_method_for
from octavo.model_executor.models.causal_lm import CausalLM
from octavo.model_executor.models.deepseek_moe import DeepseekV2MoE, DeepseekV3MoE
from octavo.model_executor.models.layer_spec import AttentionSpec, LayerSpec
from octavo.model_executor.rotary import RotaryEmbedding, mla_softmax_scale


class DeepseekV2ForCausalLM(DeepseekV2MoE, CausalLM):
    architectures = ("DeepseekV2ForCausalLM",)

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

    @classmethod
    def checkpoint_name(cls, name: str) -> str | None:
        # A full-rank q_proj is not Llama's Q of a fused Q/K/V: its own module here.
        return name.replace(".self_attn.q_proj.", ".self_attn.q_full_proj.")


class DeepseekV3ForCausalLM(DeepseekV3MoE, DeepseekV2ForCausalLM):
    architectures = ("DeepseekV3ForCausalLM",)

    def rope_interleaved(self) -> bool:
        return bool(getattr(self.config.hf, "rope_interleave", True))
