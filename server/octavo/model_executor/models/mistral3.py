"""Mistral 3 (``Mistral3ForConditionalGeneration``, Mistral Small 3.1/3.2): a Pixtral vision
tower, a patch-merging projector and the Mistral decoder ``CausalLM`` already is.

As transformers' ``modeling_mistral3``: the tower's ``hidden_states[vision_feature_layer]``
is RMS-normed, each ``spatial_merge_size``-square of patches is merged into one feature (the
square's patches concatenated channel-major, as ``F.unfold`` orders them, through
``merging_layer``), then ``linear_1 → act → linear_2``. The processor writes one ``[IMG]``
per merged feature, row by row, with ``[IMG_BREAK]`` after each row and ``[IMG_END]`` last:
those keep their text embeddings (the image's ``embed_mask``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octavo.model_executor.model_config import ModelConfig, transformers_config
from octavo.model_executor.models.llama import MistralForCausalLM
from octavo.model_executor.models.vision_checkpoint import VisionCheckpoint
from octavo.model_executor.vision.batching import ImageData, by_shape
from octavo.model_executor.vision.clip import feature_layers
from octavo.model_executor.vision.pixtral import PixtralVisionTower
from octavo.model_executor.vision.projector import MultiModalProjector
from octavo.model_executor.vision.towers import tower_checkpoint_name


class Mistral3PatchMerger(nn.Module):
    def __init__(self, hidden: int, merge: int) -> None:
        super().__init__()
        self.merge = merge
        self.merging_layer = nn.Linear(hidden * merge**2, hidden, bias=False)

    def forward(self, features: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
        """``[images, rows * cols, hidden]`` → ``[images, rows * cols / merge², hidden]``."""
        grid = features.transpose(1, 2).unflatten(2, (rows, cols))
        squares = F.unfold(grid, kernel_size=self.merge, stride=self.merge)
        return self.merging_layer(squares.transpose(1, 2))


class Mistral3MultiModalProjector(MultiModalProjector):
    def __init__(self, outer, vision_hidden: int, text_hidden: int) -> None:
        act, bias = outer.projector_hidden_act, outer.multimodal_projector_bias
        super().__init__(vision_hidden, text_hidden, act, bias)
        self.norm = nn.RMSNorm(vision_hidden, eps=outer.text_config.rms_norm_eps)
        self.patch_merger = Mistral3PatchMerger(vision_hidden, outer.spatial_merge_size)

    def forward(self, features: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
        return super().forward(self.patch_merger(self.norm(features), rows, cols))


class Mistral3ForConditionalGeneration(VisionCheckpoint, MistralForCausalLM):
    architectures = ("Mistral3ForConditionalGeneration",)

    def __init__(self, config: ModelConfig, quantization: str | None = None) -> None:
        super().__init__(config, quantization)
        outer = transformers_config(config.checkpoint)
        vision = outer.vision_config
        if not isinstance(outer.vision_feature_layer, int):
            raise ValueError("Mistral 3 takes one vision_feature_layer (its projector norms one)")
        (self.feature_layer,) = feature_layers(outer.vision_feature_layer, vision.num_hidden_layers)
        self.vision_tower = PixtralVisionTower(vision, self.feature_layer)
        self.multi_modal_projector = Mistral3MultiModalProjector(
            outer, vision.hidden_size, config.hidden_size
        )
        self.requires_grad_(False)

    @classmethod
    def vision_name(cls, name: str) -> str | None:
        """LLaVA's prefixes, and Pixtral's layer names in CLIP's terms."""
        return tower_checkpoint_name(name)

    def embed_images(self, images: list[ImageData]) -> list[torch.Tensor]:
        """Each image's features ``[placeholders, hidden]`` (its ``[IMG]`` tokens, row by
        row); images of one size go through the tower together."""
        return by_shape(images, self.embed_pixels, "pixel_values")

    def embed_pixels(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """``[images, channels, H, W]`` of one size → ``[images, features, hidden]``."""
        states = self.vision_tower.hidden_states(pixel_values)
        rows, cols = self.vision_tower.grid(pixel_values)
        return self.multi_modal_projector(states[self.feature_layer], rows, cols)
