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

from octavo.model_executor.model_config import ModelConfig, transformers_config
from octavo.model_executor.models.llama import LlamaForCausalLM
from octavo.model_executor.models.vision_checkpoint import VisionCheckpoint
from octavo.model_executor.vision.batching import ImageData, by_shape
from octavo.model_executor.vision.clip import feature_layers
from octavo.model_executor.vision.projector import MultiModalProjector
from octavo.model_executor.vision.towers import tower_checkpoint_name, vision_tower_for


class LlavaForConditionalGeneration(VisionCheckpoint, LlamaForCausalLM):
    architectures = ("LlavaForConditionalGeneration",)

    def __init__(self, config: ModelConfig, quantization: str | None = None) -> None:
        super().__init__(config, quantization)
        outer = transformers_config(config.checkpoint)
        vision = outer.vision_config
        self.feature_layers = feature_layers(outer.vision_feature_layer, vision.num_hidden_layers)
        self.drop_class_token = outer.vision_feature_select_strategy == "default"
        self.vision_tower = vision_tower_for(vision, max(self.feature_layers))  # CLIP, Pixtral
        self.multi_modal_projector = MultiModalProjector(
            vision.hidden_size * len(self.feature_layers),
            config.hidden_size,
            outer.projector_hidden_act,
            getattr(outer, "multimodal_projector_bias", True),
        )
        self.requires_grad_(False)

    @classmethod
    def vision_name(cls, name: str) -> str | None:
        """Pixtral's layer names in CLIP's terms (CLIP's own names have none of them)."""
        return tower_checkpoint_name(name)

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
