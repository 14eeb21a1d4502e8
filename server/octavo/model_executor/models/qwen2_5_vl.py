"""Qwen2.5-VL (``Qwen2_5_VLForConditionalGeneration``): the Qwen 2 decoder with M-RoPE and
the Qwen2.5-VL vision transformer (``vision/qwen2_5_vl.py``).

As transformers' ``modeling_qwen2_5_vl``: each image's features (one per spatial-merge
unit of its patches) replace its ``<|image_pad|>`` placeholders, and the decoder's rope
is multimodal: the rotary frequencies are split by ``mrope_section`` between the
temporal, height and width positions (``mrope_rotary.py``), which the runner builds for
each step from the prompt's 3-D positions (``mrope_positions.py``; ``feature_grids`` says
where each image's grid lies).
"""

from __future__ import annotations

import dataclasses

import torch

from octavo.model_executor.model_config import FULL_ATTENTION, ModelConfig, transformers_config
from octavo.model_executor.models.layer_spec import AttentionSpec
from octavo.model_executor.models.llama import Qwen2ForCausalLM
from octavo.model_executor.mrope_positions import FeatureGrid
from octavo.model_executor.mrope_rotary import MRotaryEmbedding
from octavo.model_executor.vision.batching import ImageData
from octavo.model_executor.vision.qwen2_5_vl import QWEN_BLOCK_NAMES, Qwen2_5_VisionTower
from octavo.multimodal.inputs import ImageInput

# Checkpoint prefixes (transformers 5 module names, transformers 4 files) -> ours.
_PREFIXES = {
    "model.language_model.": "model.",
    "model.visual.": "visual.",
    "visual.": "visual.",
    "lm_head.": "lm_head.",
    "model.": "model.",
}


class Qwen2_5_VLForConditionalGeneration(Qwen2ForCausalLM):
    def __init__(self, config: ModelConfig, quantization: str | None = None) -> None:
        super().__init__(config, quantization)
        vision = transformers_config(config.checkpoint).vision_config
        self.merge = vision.spatial_merge_size
        self.visual = Qwen2_5_VisionTower(vision)
        self.requires_grad_(False)

    def attention_spec(self, index: int) -> AttentionSpec:
        return dataclasses.replace(super().attention_spec(index), qkv_bias=True)

    def set_rotary(self, max_positions: int, dtype: torch.dtype, device: torch.device) -> None:
        config = self.config
        table = MRotaryEmbedding(config.head_dim, max_positions, config.rope, dtype, device)
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
            for theirs, ours in QWEN_BLOCK_NAMES.items():
                name = name.replace(theirs, ours)
        return name

    def extra_weight_keys(self) -> set[str]:
        """Every tensor of the vision tower must come from the checkpoint."""
        return {f"visual.{name}" for name, _ in self.visual.named_parameters()}

    def embed_images(self, images: list[ImageData]) -> list[torch.Tensor]:
        """Each image's features ``[placeholders, hidden]`` (all images through the tower
        at once: attention stays within each image)."""
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
