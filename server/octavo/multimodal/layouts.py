"""How each vision architecture's HF processor lays its images out.

A processor returns its tensors batched over the prompt's images, each model its own way
(LLaVA stacks ``pixel_values`` per image; LLaVA-NeXT adds ``image_sizes``; Qwen2-VL
flattens every image's patches into one tensor beside ``image_grid_thw``). An
``ImageLayout`` cuts them into one dict per image, which travels with that image's
``ImageInput`` to the model's ``embed_images``, and says how many placeholder tokens each
image has when they are not one unbroken run per image (``feature_count``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

Split = Callable[[Mapping[str, torch.Tensor], int], list[dict[str, torch.Tensor]]]


def stacked(*keys: str) -> Split:
    """Tensors whose first dimension is the image: image ``i`` takes row ``i`` of each."""

    def split(outputs: Mapping[str, torch.Tensor], count: int) -> list[dict[str, torch.Tensor]]:
        present = [key for key in keys if key in outputs]
        return [{key: outputs[key][index] for key in present} for index in range(count)]

    return split


@dataclass(frozen=True)
class ImageLayout:
    split: Split
    # Placeholder tokens of one image from its tensors; None: each image's placeholders
    # are one unbroken run, found in the expanded prompt.
    feature_count: Callable[[dict[str, torch.Tensor]], int] | None = None


LAYOUTS: dict[str, ImageLayout] = {
    "LlavaForConditionalGeneration": ImageLayout(stacked("pixel_values")),
    # pixel_values [images, tiles, C, H, W], padded to the most tiles; image_sizes (H, W)
    "LlavaNextForConditionalGeneration": ImageLayout(stacked("pixel_values", "image_sizes")),
}


def layout_of(architecture: str) -> ImageLayout:
    if architecture not in LAYOUTS:
        raise ValueError(f"no image layout for {architecture}")
    return LAYOUTS[architecture]
