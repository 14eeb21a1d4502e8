"""Gemma 2: the Llama decoder with Gemma's changes, as transformers' ``modeling_gemma2``.

* every norm is Gemma's RMSNorm (weight applied as ``1 + w``, in float32), in the sandwich
  layout: a norm before and after both attention and the MLP;
* the embedding is multiplied by ``sqrt(hidden_size)`` rounded to the model dtype (HF keeps
  it as a tensor of the weights' dtype: 55.5, not 55.43, for Gemma 2 9B in bfloat16);
* the gated MLP's activation is the config's ``hidden_activation`` (GeLU-tanh);
* the softmax scale is ``query_pre_attn_scalar ** -0.5``, not ``head_dim ** -0.5``;
* attention scores are soft-capped (``attn_logit_softcapping``) and so are the final logits
  (``final_logit_softcapping``): ``cap * tanh(x / cap)``;
* layers alternate sliding-window and full attention (``layer_types``).
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from torch import nn

from octavo.model_executor.gguf_layout import GgufLayout
from octavo.model_executor.layers.activation import activation_for
from octavo.model_executor.layers.mlp import GatedMLP
from octavo.model_executor.layers.quantization.registry import linear_method_for
from octavo.model_executor.model_config import ModelConfig
from octavo.model_executor.models.causal_lm import CausalLM
from octavo.model_executor.models.layer_spec import SANDWICH_NORM, AttentionSpec, LayerSpec


class Gemma2ForCausalLM(CausalLM):
    architectures = ("Gemma2ForCausalLM",)
    pooling_architectures = ("Gemma2Model",)
    gguf_layout = GgufLayout("gemma2", norm_plus_one=True)
    norm_kind = "gemma"

    def __init__(self, config: ModelConfig, quantization: str | None = None) -> None:
        if getattr(config.hf, "use_bidirectional_attention", False):
            raise ValueError(
                f"{config.architecture} with use_bidirectional_attention is an embedding "
                "model (EmbeddingGemma), not a causal LM: Octavo does not serve it"
            )
        super().__init__(config, quantization)

    def layer_spec(self, index: int) -> LayerSpec:
        return dataclasses.replace(super().layer_spec(index), norm_layout=SANDWICH_NORM)

    def attention_spec(self, index: int) -> AttentionSpec:
        return dataclasses.replace(
            super().attention_spec(index),
            scale=float(self.config.hf.query_pre_attn_scalar) ** -0.5,
            soft_cap=self.attention_soft_cap(),
        )

    def attention_soft_cap(self) -> float | None:
        return getattr(self.config.hf, "attn_logit_softcapping", None)

    def make_mlp(self, index: int) -> nn.Module:
        method = functools.partial(linear_method_for, self.quantization)
        activation = activation_for(self.config.hf.hidden_activation)
        return GatedMLP(self.config.hidden_size, self.config.intermediate_size, activation, method)

    def scale_embeddings(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden * embedding_normalizer(self.config.hidden_size, hidden.dtype)

    def scale_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return soft_cap(logits, getattr(self.config.hf, "final_logit_softcapping", None))


@functools.cache
def embedding_normalizer(hidden_size: int, dtype: torch.dtype) -> float:
    """``sqrt(hidden_size)`` rounded to ``dtype``, as Gemma's scaled embedding applies it."""
    return torch.tensor(hidden_size**0.5, dtype=dtype).item()


def soft_cap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """``cap * tanh(logits / cap)`` (transformers' order of operations); ``cap`` None: as is."""
    if not cap:
        return logits
    return torch.tanh(logits / cap) * cap
