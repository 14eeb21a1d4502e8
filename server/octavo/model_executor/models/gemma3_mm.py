"""Gemma 3 with images (``Gemma3ForConditionalGeneration``): a SigLIP vision tower, the
multimodal projector and the Gemma 3 decoder ``Gemma3ForCausalLM`` already is.

As transformers' ``modeling_gemma3``: the tower's last hidden state (its patch grid) is
average-pooled to ``mm_tokens_per_image`` features, normed by Gemma's RMSNorm (``1 + w``)
and multiplied by ``mm_input_projection_weight``; the features replace the image's
``<image_soft_token>`` placeholders (between ``<start_of_image>`` and ``<end_of_image>``).
The placeholders of one image attend to each other both ways (every other token is
causal, and sliding layers keep their window): the scheduler computes an image's
placeholders in one chunk (``bidirectional_images``) and the runner hands attention the
step's image spans (``AttentionMetadata.bidirectional_spans``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octavo.model_executor.layers.layernorm import GemmaRMSNorm
from octavo.model_executor.model_config import ModelConfig, transformers_config
from octavo.model_executor.models.gemma3 import Gemma3ForCausalLM
from octavo.model_executor.models.vision_checkpoint import VisionCheckpoint
from octavo.model_executor.vision.batching import ImageData, by_shape
from octavo.model_executor.vision.siglip import SiglipVisionTransformer

_UNUSED = ("vision_tower.head.",)  # SigLIP's pooling head: Gemma 3 reads the patches


class Gemma3MultiModalProjector(nn.Module):
    def __init__(self, vision, text_hidden: int, tokens_per_image: int) -> None:
        super().__init__()
        self.mm_input_projection_weight = nn.Parameter(torch.zeros(vision.hidden_size, text_hidden))
        self.mm_soft_emb_norm = GemmaRMSNorm(vision.hidden_size, vision.layer_norm_eps)
        self.patches_per_side = vision.image_size // vision.patch_size
        self.kernel = self.patches_per_side // int(tokens_per_image**0.5)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """``[images, patches, vision_hidden]`` → ``[images, tokens_per_image, hidden]``."""
        images, _, width = patches.shape
        side = self.patches_per_side
        grid = patches.transpose(1, 2).reshape(images, width, side, side)
        pooled = F.avg_pool2d(grid, self.kernel, self.kernel).flatten(2).transpose(1, 2)
        projected = self.mm_soft_emb_norm(pooled) @ self.mm_input_projection_weight
        return projected.type_as(patches)


class Gemma3ForConditionalGeneration(VisionCheckpoint, Gemma3ForCausalLM):
    architectures = ("Gemma3ForConditionalGeneration",)
    bidirectional_images = True  # an image's placeholders attend to each other both ways

    def __init__(self, config: ModelConfig, quantization: str | None = None) -> None:
        super().__init__(config, quantization)
        outer = transformers_config(config.checkpoint)
        self.vision_tower = SiglipVisionTransformer(outer.vision_config)
        self.multi_modal_projector = Gemma3MultiModalProjector(
            outer.vision_config, config.hidden_size, outer.mm_tokens_per_image
        )
        self.requires_grad_(False)

    @classmethod
    def vision_name(cls, name: str) -> str | None:
        return None if name.startswith(_UNUSED) else name

    def scale_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits  # transformers' Gemma3ForConditionalGeneration never soft-caps logits

    def embed_images(self, images: list[ImageData]) -> list[torch.Tensor]:
        """Each image's ``[mm_tokens_per_image, hidden]`` features (images of one size go
        through the tower together)."""
        return by_shape(images, self.embed_pixels, "pixel_values")

    def embed_pixels(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.multi_modal_projector(self.vision_tower(pixel_values))
