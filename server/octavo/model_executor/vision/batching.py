"""Images to a vision tower in batches: one forward per group of images whose tensors
have the same shape (most processors resize every image to one size)."""

from __future__ import annotations

from collections.abc import Callable

import torch

ImageData = dict[str, torch.Tensor]  # one image's processor tensors (``ImageInput.data``)


def on_device(data: ImageData, device: torch.device, dtype: torch.dtype) -> ImageData:
    """The image's tensors on ``device``; floating ones (pixels) in the model's ``dtype``."""
    return {
        key: value.to(device, dtype) if value.is_floating_point() else value.to(device)
        for key, value in data.items()
    }


def by_shape(
    images: list[ImageData], encode: Callable[[torch.Tensor], torch.Tensor], key: str
) -> list[torch.Tensor]:
    """``encode`` on ``images[i][key]`` stacked by shape: each image's output, in order."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for index, data in enumerate(images):
        groups.setdefault(tuple(data[key].shape), []).append(index)
    outputs: list[torch.Tensor | None] = [None] * len(images)
    for indices in groups.values():
        batch = encode(torch.stack([images[index][key] for index in indices]))
        for index, features in zip(indices, batch, strict=True):
            outputs[index] = features
    return outputs  # type: ignore[return-value]
