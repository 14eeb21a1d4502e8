"""LLaVA-NeXT (``LlavaNextForConditionalGeneration``): LLaVA-1.5's CLIP tower, projector
and Llama decoder, on "any-resolution" tiles.

As transformers' ``modeling_llava_next``: the processor gives each image a base tile (the
whole picture resized) and the tiles of a grid chosen from ``image_grid_pinpoints`` by the
image's size (padded to the prompt's most tiles: only the grid's ``rows * cols + 1`` are
real). Every tile goes through the tower and projector as in LLaVA; the grid's patch
features are laid out as one picture, the rows or columns the processor's letterbox added
are cut off by the original ``image_sizes`` (unpad), and the learned ``image_newline``
closes each row. An image's features: the base tile's, then the grid's row by row.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.image_processing_utils import select_best_resolution

from octavo.model_executor.model_config import ModelConfig, transformers_config
from octavo.model_executor.models.llava import LlavaForConditionalGeneration
from octavo.model_executor.vision.batching import ImageData

_NEWLINE_NAMES = ("model.image_newline", "image_newline")


class LlavaNextForConditionalGeneration(LlavaForConditionalGeneration):
    architectures = ("LlavaNextForConditionalGeneration",)

    def __init__(self, config: ModelConfig, quantization: str | None = None) -> None:
        super().__init__(config, quantization)
        outer = transformers_config(config.checkpoint)
        self.grid_pinpoints = [tuple(pinpoint) for pinpoint in outer.image_grid_pinpoints]
        self.tile_size = outer.vision_config.image_size
        self.patches_per_side = self.tile_size // outer.vision_config.patch_size
        self.image_newline = nn.Parameter(torch.empty(config.hidden_size), requires_grad=False)

    @classmethod
    def checkpoint_name(cls, name: str) -> str | None:
        if name in _NEWLINE_NAMES:
            return "image_newline"
        return super().checkpoint_name(name)

    def extra_weight_keys(self) -> set[str]:
        return super().extra_weight_keys() | {"image_newline"}

    def tile_grid(self, image_size: torch.Tensor) -> tuple[int, int]:
        """(rows, columns) of tiles the processor cut an image of ``image_size`` (H, W) into."""
        height, width = select_best_resolution(image_size.tolist(), self.grid_pinpoints)
        return height // self.tile_size, width // self.tile_size

    def embed_images(self, images: list[ImageData]) -> list[torch.Tensor]:
        """Each image's features ``[placeholders, hidden]``; every real tile of every image
        goes through the tower in one batch (tiles are all ``tile_size`` square)."""
        grids = [self.tile_grid(data["image_sizes"]) for data in images]
        tiles = [
            data["pixel_values"][: rows * columns + 1]
            for data, (rows, columns) in zip(images, grids, strict=True)
        ]
        features = self.embed_pixels(torch.cat(tiles)).split([len(t) for t in tiles])
        return [
            self.pack(tile_features, grid, data["image_sizes"])
            for tile_features, grid, data in zip(features, grids, images, strict=True)
        ]

    def pack(
        self, features: torch.Tensor, grid: tuple[int, int], image_size: torch.Tensor
    ) -> torch.Tensor:
        """``[tiles, patches, hidden]`` → the base tile's patches, then the grid's
        (unpadded, each row closed by ``image_newline``)."""
        rows, columns = grid
        side, hidden = self.patches_per_side, features.shape[-1]
        picture = features[1:].view(rows, columns, side, side, hidden)
        picture = picture.permute(0, 2, 1, 3, 4).reshape(rows * side, columns * side, hidden)
        picture = unpad(picture, image_size.tolist())
        newline = self.image_newline.to(picture.dtype).expand(picture.shape[0], 1, hidden)
        return torch.cat([features[0], torch.cat([picture, newline], dim=1).flatten(0, 1)])


def unpad(picture: torch.Tensor, original_size: list[int]) -> torch.Tensor:
    """``picture`` ``[H, W, hidden]`` without the bands the processor's letterbox added to
    keep an image of ``original_size`` (height, width) at its aspect ratio."""
    height, width = original_size
    current_height, current_width = picture.shape[:2]
    if width / height > current_width / current_height:  # bands above and below
        kept = int(round(height * (current_width / width), 7))
        band = (current_height - kept) // 2
        return picture[band : current_height - band]
    kept = int(round(width * (current_height / height), 7))
    band = (current_width - kept) // 2
    return picture[:, band : current_width - band]
