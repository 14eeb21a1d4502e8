"""Qwen3-VL (``Qwen3VLForConditionalGeneration``): the Qwen 3 decoder with interleaved
M-RoPE and DeepStack, and the Qwen3-VL vision transformer (``vision/qwen3_vl.py``).

As transformers' ``modeling_qwen3_vl``: each image's features replace its
``<|image_pad|>`` placeholders; the rope's frequencies take their angle from the
temporal, height or width position in turn (``mrope_rotary.py``, interleaved); and the
tower's DeepStack features of those placeholders are added to the hidden states after
the first decoder layers (one level per layer). The encoder cache keeps an image's
features and DeepStack features side by side in one row per placeholder, so a chunk
takes the slice it covers of both.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from octavo.model_executor.image_embeds import ImageEmbeds
from octavo.model_executor.model_config import FULL_ATTENTION, ModelConfig, transformers_config
from octavo.model_executor.models.qwen3 import Qwen3ForCausalLM
from octavo.model_executor.mrope_positions import FeatureGrid
from octavo.model_executor.mrope_rotary import MRotaryEmbedding
from octavo.model_executor.vision.batching import ImageData
from octavo.model_executor.vision.qwen3_vl import QWEN3_BLOCK_NAMES, Qwen3_VisionTower
from octavo.multimodal.inputs import ImageInput

# Checkpoint prefixes (transformers 5 module names, transformers 4 files) -> ours.
_PREFIXES = {
    "model.language_model.": "model.",
    "model.visual.": "visual.",
    "visual.": "visual.",
    "lm_head.": "lm_head.",
    "model.": "model.",
}


@dataclasses.dataclass
class DeepstackRows:
    rows: torch.Tensor  # the step's placeholder rows
    levels: torch.Tensor  # [levels, rows, hidden]: added after decoder layer 0, 1, ...


class Qwen3VLForConditionalGeneration(Qwen3ForCausalLM):
    def __init__(self, config: ModelConfig, quantization: str | None = None) -> None:
        super().__init__(config, quantization)
        vision = transformers_config(config.checkpoint).vision_config
        self.merge = vision.spatial_merge_size
        self.visual = Qwen3_VisionTower(vision)
        self.deepstack: DeepstackRows | None = None  # this step's, set by ``embed``
        levels = len(vision.deepstack_visual_indexes)
        for local, layer in enumerate(self.layers):
            level = self.first_layer + local
            if level < levels:
                layer.register_forward_hook(functools.partial(self._add_deepstack, level))
        self.requires_grad_(False)

    def set_rotary(self, max_positions: int, dtype: torch.dtype, device: torch.device) -> None:
        config = self.config
        table = MRotaryEmbedding(
            config.head_dim, max_positions, config.rope, dtype, device, interleaved=True
        )
        self.rotary = {FULL_ATTENTION: table}

    @classmethod
    def checkpoint_name(cls, name: str) -> str | None:
        for prefix, renamed in _PREFIXES.items():
            if name.startswith(prefix):
                name = renamed + name.removeprefix(prefix)
                break
        else:
            return None
        if name.startswith("visual.blocks."):
            for theirs, ours in QWEN3_BLOCK_NAMES.items():
                name = name.replace(theirs, ours)
        return name

    def extra_weight_keys(self) -> set[str]:
        """Every tensor of the vision tower must come from the checkpoint."""
        return {f"visual.{name}" for name, _ in self.visual.named_parameters()}

    def embed_images(self, images: list[ImageData]) -> list[torch.Tensor]:
        """Each image's ``[placeholders, hidden * (1 + DeepStack levels)]`` (all images
        through the tower at once: attention stays within each image)."""
        grids = [tuple(int(size) for size in image["image_grid_thw"]) for image in images]
        pixels = torch.cat([image["pixel_values"] for image in images])
        features = self.visual(pixels, grids)
        return list(features.split([t * h * w // self.merge**2 for t, h, w in grids]))

    def feature_grids(self, images: list[ImageInput]) -> list[FeatureGrid]:
        """Each image's placeholder run as its grid of features (for M-RoPE positions)."""
        grids = []
        for image in images:
            t, h, w = (int(size) for size in image.data["image_grid_thw"])
            grids.append(FeatureGrid(image.offset, t, h // self.merge, w // self.merge))
        return grids

    def embed(self, input_ids: torch.Tensor, image_embeds: ImageEmbeds | None) -> torch.Tensor:
        """The embeddings with the images' features; their DeepStack levels kept for the
        layer hooks of this step."""
        self.deepstack = None
        if image_embeds is None:
            return super().embed(input_ids, None)
        width = self.config.hidden_size
        features = image_embeds.features
        levels = features[:, width:].view(features.shape[0], -1, width).transpose(0, 1)
        self.deepstack = DeepstackRows(image_embeds.rows, levels)
        return super().embed(input_ids, ImageEmbeds(image_embeds.rows, features[:, :width]))

    def _add_deepstack(self, level: int, module, inputs, output):
        """After decoder layer ``level``: its output (``hidden + residual``) plus the
        DeepStack level at the placeholder rows, carried whole in the residual."""
        if self.deepstack is None:
            return None
        hidden, residual = output
        summed = hidden + residual
        rows, levels = self.deepstack.rows, self.deepstack.levels
        summed[rows] += levels[level].to(summed.dtype)
        return torch.zeros_like(hidden), summed
