"""What Qwen2.5-VL and Qwen3-VL add to their decoder alike: the vision tower under
``visual`` (all images of a step through it at once), checkpoint names, the M-RoPE table
and each image's feature grid for the 3-D positions (``mrope_positions.py``).

A model class lists this mixin before its decoder class and sets ``visual``, ``merge``
(the tower's spatial merge) and ``block_names`` (its blocks' checkpoint names -> the CLIP
layer's).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from octavo.model_executor.model_config import FULL_ATTENTION
from octavo.model_executor.models.vision_checkpoint import VisionCheckpoint
from octavo.model_executor.mrope_positions import FeatureGrid
from octavo.model_executor.mrope_rotary import MRotaryEmbedding
from octavo.model_executor.vision.batching import ImageData
from octavo.multimodal.inputs import ImageInput

# Checkpoint prefixes (transformers 5 module names, transformers 4 files) -> ours.
_PREFIXES = {
    "model.language_model.": "model.",
    "model.visual.": "visual.",
    "visual.": "visual.",
    "lm_head.": "lm_head.",
    "model.": "model.",
}

Grid = tuple[int, int, int]  # an image's (t, h, w) in patches


class QwenVLImages(VisionCheckpoint):
    checkpoint_prefixes = _PREFIXES
    vision_modules = ("visual",)
    block_names: ClassVar[dict[str, str]] = {}
    mrope_interleaved: ClassVar[bool] = False  # Qwen3-VL's t h w t h w ... frequencies
    visual: nn.Module
    merge: int

    def set_rotary(self, max_positions: int, dtype: torch.dtype, device: torch.device) -> None:
        config = self.config
        table = MRotaryEmbedding(
            config.head_dim, max_positions, config.rope, dtype, device, self.mrope_interleaved
        )
        self.rotary = {FULL_ATTENTION: table}

    @classmethod
    def vision_name(cls, name: str) -> str | None:
        """The tower's blocks under the CLIP layer's names."""
        if name.startswith("visual.blocks."):
            for theirs, ours in cls.block_names.items():
                name = name.replace(theirs, ours)
        return name

    def embed_images(self, images: list[ImageData]) -> list[torch.Tensor]:
        """Each image's rows, one per placeholder (all images through the tower at once:
        attention stays within each image)."""
        grids: list[Grid] = [tuple(int(n) for n in image["image_grid_thw"]) for image in images]
        pixels = torch.cat([image["pixel_values"] for image in images])
        features = self.visual(pixels, grids)
        return list(features.split([t * h * w // self.merge**2 for t, h, w in grids]))

    def mrope_grids(self, images: list[ImageInput]) -> list[FeatureGrid]:
        """Each image's placeholder run as its grid of features (for M-RoPE positions)."""
        grids = []
        for image in images:
            t, h, w = (int(size) for size in image.data["image_grid_thw"])
            grids.append(FeatureGrid(image.offset, t, h // self.merge, w // self.merge))
        return grids
