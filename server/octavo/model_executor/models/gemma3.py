"""Gemma 3: Gemma 2's decoder with per-head Q/K norms and rope per layer type.

As transformers' ``modeling_gemma3``, it differs from Gemma 2 in that

* queries and keys pass a Gemma RMSNorm (``1 + w``) over each head before the rotation;
* sliding layers rotate with the local base (``rope_parameters["sliding_attention"]``,
  10 000) and full layers with the global one and its scaling (``"full_attention"``);
* attention scores are not soft-capped (transformers' Gemma 3 attention ignores
  ``attn_logit_softcapping``); the final logits are when ``final_logit_softcapping`` is set.

``Gemma3ForConditionalGeneration`` (the image-text models, e.g. google/gemma-3-4b-it) is
this decoder with a vision tower: ``gemma3_mm.py``.
"""

from __future__ import annotations

import dataclasses

from octavo.model_executor.gguf_layout import GgufLayout
from octavo.model_executor.models.gemma2 import Gemma2ForCausalLM
from octavo.model_executor.models.layer_spec import AttentionSpec
from octavo.model_executor.rope_parameters import rope_parameters_for


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    architectures = ("Gemma3ForCausalLM",)
    pooling_architectures = ("Gemma3TextModel",)
    gguf_layout = GgufLayout("gemma3", norm_plus_one=True)

    def attention_spec(self, index: int) -> AttentionSpec:
        return dataclasses.replace(
            super().attention_spec(index), qk_norm="head", rope=self.config.layer_types[index]
        )

    def attention_soft_cap(self) -> float | None:
        return None

    def rope_parameters(self) -> dict[str, dict]:
        """One rope table per layer type the model has (transformers' config object has
        already merged older spellings, e.g. ``rope_local_base_freq``, into it)."""
        raw = self.config.hf.to_dict()
        types = dict.fromkeys(self.config.layer_types)
        return {layer_type: rope_parameters_for(raw, layer_type) for layer_type in types}
