"""Idefics3 and SmolVLM (``Idefics3ForConditionalGeneration``,
``SmolVLMForConditionalGeneration``): the Idefics3 vision tower, a connector and the Llama
decoder ``CausalLM`` already is. SmolVLM is Idefics3 under another name (its processor
differs: video frames; the model's math is the same).

As transformers' ``modeling_idefics3``: every tile of an image (its ``rows x cols`` tiles,
then the global image) goes through the tower; the connector's pixel shuffle folds each
``scale_factor x scale_factor`` square of patches into one feature (``image_seq_len`` per
tile) before a linear projection to the text width. An image's features, tile after tile,
replace its placeholders (the prompt's text between tiles keeps its own embeddings).
"""

from __future__ import annotations

import torch
from torch import nn

from octavo.model_executor.model_config import ModelConfig, transformers_config
from octavo.model_executor.models.llama import LlamaForCausalLM
from octavo.model_executor.models.vision_checkpoint import VisionCheckpoint
from octavo.model_executor.vision.batching import ImageData
from octavo.model_executor.vision.idefics3 import Idefics3VisionTransformer

# Checkpoint prefixes -> ours (transformers 4 and 5 name the modules the same).
_PREFIXES = {
    "model.text_model.": "model.",
    "lm_head.": "lm_head.",
    "model.vision_model.": "vision_model.",
    "model.connector.": "connector.",
}


class Idefics3SimpleMLP(nn.Module):
    def __init__(self, in_features: int, hidden: int) -> None:
        super().__init__()
        self.proj = nn.Linear(in_features, hidden, bias=False)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.proj(features)


class Idefics3Connector(nn.Module):
    def __init__(self, vision_width: int, hidden: int, scale_factor: int) -> None:
        super().__init__()
        self.scale_factor = scale_factor
        self.modality_projection = Idefics3SimpleMLP(vision_width * scale_factor**2, hidden)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """``[tiles, side * side, width]`` → ``[tiles, (side / s) ** 2, hidden]``."""
        return self.modality_projection(pixel_shuffle(patches, self.scale_factor))


def pixel_shuffle(patches: torch.Tensor, scale: int) -> torch.Tensor:
    """Each ``scale x scale`` square of a tile's square patch grid as one row: its patches
    row by row, concatenated (transformers' order), squares in row-major order."""
    tiles, count, width = patches.shape
    side = int(count**0.5)
    grid = patches.view(tiles, side // scale, scale, side // scale, scale, width)
    squares = grid.permute(0, 1, 3, 2, 4, 5)  # [tiles, square row, square col, row, col, w]
    return squares.reshape(tiles, count // scale**2, width * scale**2)


class Idefics3ForConditionalGeneration(VisionCheckpoint, LlamaForCausalLM):
    architectures = ("Idefics3ForConditionalGeneration",)
    checkpoint_prefixes = _PREFIXES
    vision_modules = ("vision_model", "connector")

    def __init__(self, config: ModelConfig, quantization: str | None = None) -> None:
        super().__init__(config, quantization)
        outer = transformers_config(config.checkpoint)
        vision = outer.vision_config
        self.vision_model = Idefics3VisionTransformer(vision)
        self.connector = Idefics3Connector(
            vision.hidden_size, config.hidden_size, outer.scale_factor
        )
        self.requires_grad_(False)

    def embed_images(self, images: list[ImageData]) -> list[torch.Tensor]:
        """Each image's features ``[tiles * image_seq_len, hidden]``, its tiles in order
        (the tiles of all the images go through the tower together)."""
        pixels = torch.cat([image["pixel_values"] for image in images])
        masks = torch.cat([pixel_mask(image) for image in images])
        features = self.connector(self.vision_model(pixels, masks))
        tiles = [len(image["pixel_values"]) for image in images]
        return [part.flatten(0, 1) for part in features.split(tiles)]


def pixel_mask(image: ImageData) -> torch.Tensor:
    """The image's real pixels ``[tiles, H, W]`` (all of them when it has no mask)."""
    if "pixel_attention_mask" in image:
        return image["pixel_attention_mask"].bool()
    pixels = image["pixel_values"]
    return torch.ones(pixels.shape[0], *pixels.shape[2:], dtype=torch.bool, device=pixels.device)


class SmolVLMForConditionalGeneration(Idefics3ForConditionalGeneration):
    architectures = ("SmolVLMForConditionalGeneration",)
