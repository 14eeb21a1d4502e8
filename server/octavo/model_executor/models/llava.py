"""LLaVA-1.5 (``LlavaForConditionalGeneration``): a CLIP vision tower, a two-layer
projector and the Llama decoder ``CausalLM`` already is.

As transformers' ``modeling_llava``: the tower's ``hidden_states[vision_feature_layer]``
(several layers concatenated when it is a list), without the class token under the
``default`` select strategy, pass ``linear_1 → act → linear_2``; the language model
takes these features in place of the prompt's ``<image>`` placeholder embeddings
(``CausalLM.embed`` with a step's ``ImageEmbeds``).
"""

from __future__ import annotations

import torch
from torch import nn

from octavo.model_executor.model_config import ModelConfig, transformers_config
from octavo.model_executor.models.llama import LlamaForCausalLM
from octavo.model_executor.vision.activations import activation
from octavo.model_executor.vision.batching import ImageData, by_shape
from octavo.model_executor.vision.clip import feature_layers
from octavo.model_executor.vision.towers import tower_checkpoint_name, vision_tower_for

# Checkpoint prefixes (transformers 4 files, transformers 5 module names) -> ours.
_PREFIXES = {
    "language_model.model.": "model.",
    "model.language_model.": "model.",
    "language_model.lm_head.": "lm_head.",
    "lm_head.": "lm_head.",
    "vision_tower.vision_model.": "vision_tower.",
    "model.vision_tower.vision_model.": "vision_tower.",
    "model.vision_tower.": "vision_tower.",
    "vision_tower.": "vision_tower.",
    "model.multi_modal_projector.": "multi_modal_projector.",
    "multi_modal_projector.": "multi_modal_projector.",
}


class LlavaMultiModalProjector(nn.Module):
    def __init__(self, in_features: int, hidden: int, act: str, bias: bool) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(in_features, hidden, bias=bias)
        self.act = activation(act)
        self.linear_2 = nn.Linear(hidden, hidden, bias=bias)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(features)))


class LlavaForConditionalGeneration(LlamaForCausalLM):
    def __init__(self, config: ModelConfig, quantization: str | None = None) -> None:
        super().__init__(config, quantization)
        outer = transformers_config(config.checkpoint)
        vision = outer.vision_config
        self.feature_layers = feature_layers(outer.vision_feature_layer, vision.num_hidden_layers)
        self.drop_class_token = outer.vision_feature_select_strategy == "default"
        self.vision_tower = vision_tower_for(vision, max(self.feature_layers))  # CLIP, Pixtral
        self.multi_modal_projector = LlavaMultiModalProjector(
            vision.hidden_size * len(self.feature_layers),
            config.hidden_size,
            outer.projector_hidden_act,
            getattr(outer, "multimodal_projector_bias", True),
        )
        self.requires_grad_(False)

    @classmethod
    def checkpoint_name(cls, name: str) -> str | None:
        for prefix, renamed in _PREFIXES.items():
            if name.startswith(prefix):
                return tower_checkpoint_name(renamed + name.removeprefix(prefix))
        return None

    def extra_weight_keys(self) -> set[str]:
        """Every tensor of the vision tower and projector must come from the checkpoint."""
        modules = {
            "vision_tower": self.vision_tower,
            "multi_modal_projector": self.multi_modal_projector,
        }
        return {
            f"{prefix}.{name}"
            for prefix, module in modules.items()
            for name, _ in module.named_parameters()
        }

    def embed_images(self, images: list[ImageData]) -> list[torch.Tensor]:
        """Each image's features ``[placeholders, hidden]``: what replaces its placeholder
        embeddings (images of one size go through the tower together)."""
        return by_shape(images, self.embed_pixels, "pixel_values")

    def embed_pixels(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """``[images, channels, H, W]`` → ``[images, features, hidden]``."""
        states = self.vision_tower.hidden_states(pixel_values)
        selected = [states[index] for index in self.feature_layers]
        if self.drop_class_token:
            selected = [state[:, 1:] for state in selected]
        return self.multi_modal_projector(torch.cat(selected, dim=-1))
