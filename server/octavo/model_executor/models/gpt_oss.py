"""gpt-oss: a pre-norm decoder whose every feed-forward block is a mixture of experts, as
transformers' ``modeling_gpt_oss``.

* attention has biases on Q/K/V and the output projection, and a learned per-head
  *sink*: one more logit in every softmax whose probability mass is dropped
  (``self_attn.sinks``, split by heads under tensor parallelism);
* layers alternate sliding-window and full attention (``layer_types``; the window is 128
  in the released models); rope is yarn (``rope_parameters``);
* the router (``mlp.router``, with a bias) takes the top-k logits and softmaxes over them;
* the experts have biases and apply the clamped SwiGLU (``swiglu_alpha``,
  ``swiglu_limit``); the checkpoint stacks them (``mlp.experts.gate_up_proj`` with gate
  and up interleaved, ``down_proj``), in float or as MXFP4 ``_blocks`` / ``_scales``,
  which a ``mxfp4`` model keeps 4-bit (``layers/moe/mxfp4_experts.py``; a float model
  built from such a checkpoint dequantizes them at load).
"""

from __future__ import annotations

import dataclasses

from torch import nn

from octavo.model_executor.gguf_layout import GgufLayout
from octavo.model_executor.layers.activation import ClampedSwigluAndMul
from octavo.model_executor.layers.moe import ExpertNames, FusedMoE
from octavo.model_executor.models.causal_lm import CausalLM
from octavo.model_executor.models.layer_spec import AttentionSpec


class GptOssForCausalLM(CausalLM):
    architectures = ("GptOssForCausalLM",)
    gguf_layout = GgufLayout(
        "gpt-oss",
        tensor_choices={"ffn_gate_inp": "mlp.router"},
        moe_block="mlp",
        model_type="gpt_oss",
        config_keys={
            "expert_count": "num_local_experts",
            "expert_used_count": "num_experts_per_tok",
            "attention.sliding_window": "sliding_window",
        },
    )
    expert_names = ExpertNames(  # every expert stacked in one tensor per projection
        router_weight="router.weight",
        router_bias="router.bias",
        fused_gate_up="experts.gate_up_proj",
        fused_gate_up_bias="experts.gate_up_proj_bias",
        fused_down="experts.down_proj",
        fused_down_bias="experts.down_proj_bias",
    )

    def attention_spec(self, index: int) -> AttentionSpec:
        return dataclasses.replace(super().attention_spec(index), sinks=True)

    def make_mlp(self, index: int) -> nn.Module:
        config, hf = self.config, self.config.hf
        return FusedMoE(
            hf.num_local_experts,
            hf.num_experts_per_tok,
            config.hidden_size,
            config.intermediate_size,
            names=self.expert_names,
            router="softmax_after_topk",
            renormalize=False,
            activation=ClampedSwigluAndMul(hf.swiglu_alpha, hf.swiglu_limit),
            bias=True,
            router_bias=True,
            quantization=self.quantization,
            enable_expert_parallel=config.enable_expert_parallel,
        )
