"""Gemma 3: Gemma 2's decoder with per-head Q/K norms and rope per layer type.

As transformers' ``modeling_gemma3``, it differs from Gemma 2 in that

* queries and keys pass a Gemma RMSNorm (``1 + w``) over each head before the rotation;
* sliding layers rotate with the local base (``rope_parameters["sliding_attention"]``,
  10 000) and full layers with the global one and its scaling (``"full_attention"``);
* attention scores are not soft-capped (transformers' Gemma 3 attention ignores
  ``attn_logit_softcapping``); the final logits are when ``final_logit_softcapping`` is set.

``Gemma3ForConditionalGeneration`` checkpoints (the image-text models, e.g.
google/gemma-3-4b-it) serve as text models: their text tower (``text_config``) is this
model; transformers writes its tensors as ``language_model.model.*`` (and reads
``model.language_model.*`` too); the vision tower and the projector are not loaded.
"""

from __future__ import annotations

import dataclasses

import torch

from octavo.model_executor.models.gemma2 import Gemma2ForCausalLM
from octavo.model_executor.models.layer_spec import AttentionSpec
from octavo.model_executor.rotary import rope_parameters_for


class Gemma3ForCausalLM(Gemma2ForCausalLM):
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


# The text tower's tensors in a Gemma3ForConditionalGeneration checkpoint -> Llama naming.
_TEXT_TOWER_PREFIXES = {
    "language_model.model.": "model.",  # as transformers writes them (and Google's files)
    "model.language_model.": "model.",  # transformers' module names
    "language_model.lm_head.": "lm_head.",
    "lm_head.": "lm_head.",
}


class Gemma3ForConditionalGeneration(Gemma3ForCausalLM):
    """The text tower of an image-text Gemma 3 checkpoint (the vision tower is skipped)."""

    @classmethod
    def checkpoint_name(cls, name: str) -> str | None:
        for prefix, renamed in _TEXT_TOWER_PREFIXES.items():
            if name.startswith(prefix):
                return renamed + name.removeprefix(prefix)
        return None  # vision_tower.*, multi_modal_projector.*

    def scale_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits  # transformers' Gemma3ForConditionalGeneration never soft-caps logits
