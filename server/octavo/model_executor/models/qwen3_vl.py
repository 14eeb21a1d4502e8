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
from octavo.model_executor.model_config import ModelConfig, transformers_config
from octavo.model_executor.models.qwen3 import Qwen3ForCausalLM
from octavo.model_executor.models.qwen_vl import QwenVLImages
from octavo.model_executor.vision.qwen3_vl import QWEN3_BLOCK_NAMES, Qwen3_VisionTower


@dataclasses.dataclass
class DeepstackRows:
    rows: torch.Tensor  # the step's placeholder rows
    levels: torch.Tensor  # [levels, rows, hidden]: added after decoder layer 0, 1, ...


class Qwen3VLForConditionalGeneration(QwenVLImages, Qwen3ForCausalLM):
    architectures = ("Qwen3VLForConditionalGeneration",)
    block_names = QWEN3_BLOCK_NAMES
    mrope_interleaved = True

    def __init__(self, config: ModelConfig, quantization: str | None = None) -> None:
        super().__init__(config, quantization)
        vision = transformers_config(config.checkpoint).vision_config
        self.merge = vision.spatial_merge_size
        self.visual = Qwen3_VisionTower(vision)
        self.deepstack: DeepstackRows | None = None  # this step's, set by ``embed``
        self._hook_deepstack(len(vision.deepstack_visual_indexes))
        self.requires_grad_(False)

    def _hook_deepstack(self, levels: int) -> None:
        """A hook adding DeepStack level ``i`` after decoder layer ``i`` (this stage's)."""
        for local, layer in enumerate(self.layers):
            level = self.first_layer + local
            if level >= levels:
                continue
            if not self.stage.is_first:  # the images are embedded in the first stage
                raise ValueError(
                    f"Qwen3-VL adds DeepStack features after its first {levels} layers: "
                    "they must all be in the first pipeline stage"
                )
            layer.register_forward_hook(functools.partial(self._add_deepstack, level))

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
