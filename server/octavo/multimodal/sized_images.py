"""Pixtral's processor layout (Mistral 3, Pixtral-12B): images keep their own sizes.

The processor resizes each image to multiples of ``patch_size * spatial_merge_size`` and
pads the batch's ``pixel_values`` to the largest, beside ``image_sizes`` (height, width).
Each image gets its own un-padded pixels back and its grid of features (one per merged
square of patches); its placeholders are one ``[IMG]`` per feature, written row by row
with ``[IMG_BREAK]`` after each row and ``[IMG_END]`` at the end (text between the runs).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used (the image path); not by a text model's server
    import torch


def feature_grids(hf_processor: Any, outputs: Mapping[str, torch.Tensor]) -> dict:
    """``feature_grid`` [images, 2]: each image's features down and across."""
    import torch

    merged_patch = hf_processor.patch_size * getattr(hf_processor, "spatial_merge_size", 1)
    sizes = torch.as_tensor(outputs["image_sizes"])
    return {"feature_grid": sizes // merged_patch}


def split_sized(outputs: Mapping[str, torch.Tensor], count: int) -> list[dict[str, torch.Tensor]]:
    """Image ``i``'s pixels cropped to its ``image_sizes`` row (a copy: not a view of the
    padded batch), its size and its feature grid."""
    import torch

    sizes = torch.as_tensor(outputs["image_sizes"])
    per_image = []
    for index in range(count):
        height, width = sizes[index].tolist()
        pixels = outputs["pixel_values"][index][:, :height, :width].clone()
        per_image.append(
            {
                "pixel_values": pixels,
                "image_sizes": sizes[index],
                "feature_grid": outputs["feature_grid"][index],
            }
        )
    return per_image


def sized_features(data: dict[str, torch.Tensor]) -> int:
    """An image's ``[IMG]`` placeholders: its feature grid's rows times columns."""
    return int(data["feature_grid"].prod())
