"""IBM Granite 3.x (``GraniteForCausalLM``): the Llama decoder with four scalars from the
config, as transformers' ``modeling_granite``:

* ``embedding_multiplier`` multiplies the token embeddings;
* ``residual_multiplier`` multiplies each attention and MLP output before the residual add;
* ``attention_multiplier`` is the softmax scale (instead of ``head_dim ** -0.5``);
* ``logits_scaling`` divides the logits.
"""

from __future__ import annotations

import dataclasses

import torch

from octavo.model_executor.gguf_layout import GgufLayout
from octavo.model_executor.models.causal_lm import CausalLM
from octavo.model_executor.models.layer_spec import AttentionSpec, LayerSpec


class GraniteForCausalLM(CausalLM):
    architectures = ("GraniteForCausalLM",)
    gguf_layout = GgufLayout(
        "granite",
        permuted_qk=True,
        model_type="granite",
        config_keys={
            "embedding_scale": "embedding_multiplier",
            "residual_scale": "residual_multiplier",
            "attention.scale": "attention_multiplier",
            "logit_scale": "logits_scaling",
        },
    )

    def attention_spec(self, index: int) -> AttentionSpec:
        scale = float(self.config.hf.attention_multiplier)
        return dataclasses.replace(super().attention_spec(index), scale=scale)

    def layer_spec(self, index: int) -> LayerSpec:
        multiplier = float(self.config.hf.residual_multiplier)
        return dataclasses.replace(super().layer_spec(index), residual_multiplier=multiplier)

    def scale_embeddings(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden * float(self.config.hf.embedding_multiplier)

    def scale_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits / float(self.config.hf.logits_scaling)
