"""OLMo 3 (``Olmo3ForCausalLM``): OLMo 2's decoder (post-norm layout, Q/K RMSNorm over the
whole projections) whose layers follow ``layer_types``, as transformers'
``modeling_olmo3``: sliding-window attention (``sliding_window``) in three of every four
layers and full attention in the fourth by default, each layer type with its own rope
settings (``rope_parameters[layer_type]``; transformers applies a config's older
``rope_scaling``, e.g. OLMo 3's YaRN, to the full-attention layers only).
"""

from __future__ import annotations

import dataclasses

from octavo.model_executor.models.layer_spec import AttentionSpec
from octavo.model_executor.models.olmo2 import Olmo2ForCausalLM
from octavo.model_executor.rope_parameters import rope_parameters_for


class Olmo3ForCausalLM(Olmo2ForCausalLM):
    architectures = ("Olmo3ForCausalLM",)

    def attention_spec(self, index: int) -> AttentionSpec:
        layer_type = self.config.layer_types[index]
        return dataclasses.replace(super().attention_spec(index), rope=layer_type)

    def rope_parameters(self) -> dict[str, dict]:
        """One rope table per layer type, from transformers' per-type settings."""
        raw = self.config.hf.to_dict()
        types = dict.fromkeys(self.config.layer_types)
        return {layer_type: rope_parameters_for(raw, layer_type) for layer_type in types}
