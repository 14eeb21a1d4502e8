"""Idefics3 / SmolVLM images as their processor lays them out: tiles and a global image.

The processor resizes an image, cuts it into ``rows x cols`` tiles (none when it fits in
one) and adds the whole image resized to one tile (the global image). ``pixel_values`` is
``[prompts, tiles, C, H, W]``: all the tiles of a prompt's images in order, all-zero tiles
padding the prompts with fewer, beside ``pixel_attention_mask`` (the real pixels of each).
In the prompt each tile is ``<fake_token_around_image>``, its marker (``<row_i_col_j>``,
``<global-img>`` for the global image) and ``image_seq_len`` placeholders, with newlines
between rows: an image's placeholders are several runs with text between them.

How many tiles each image has is not among the processor's tensors (it drops its
``rows``/``cols``), but the prompt shows it: an image's tiles are the placeholder runs up
to the one the global-image marker leads, the last of each image.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from octavo.multimodal.inputs import placeholder_runs

if TYPE_CHECKING:  # imported where used (the image path); not by a text model's server
    import torch


def tile_counts(processor: Any, outputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``tiles_per_image`` (from the prompt) and the processor's ``image_seq_len``."""
    import torch

    token_ids = outputs["input_ids"][0].tolist()
    marker = global_marker_ids(processor)
    counts, tiles = [], 0
    for offset, _ in placeholder_runs(token_ids, processor.image_token_id):
        tiles += 1
        if token_ids[max(offset - len(marker), 0) : offset] == marker:
            counts.append(tiles)
            tiles = 0
    if tiles:
        raise ValueError(f"{tiles} image tiles of the prompt are not followed by a global image")
    return {
        "tiles_per_image": torch.tensor(counts),
        "image_seq_len": torch.tensor(processor.image_seq_len),
    }


def global_marker_ids(processor: Any) -> list[int]:
    """The token ids of the global image's marker (SmolVLM and Idefics3 name it apart)."""
    marker = getattr(processor, "global_image_token", None) or processor.global_image_tag
    return processor.tokenizer(marker, add_special_tokens=False)["input_ids"]


def split_tiles(outputs: Mapping[str, torch.Tensor], count: int) -> list[dict[str, torch.Tensor]]:
    """Each image's tiles (``pixel_values [tiles, C, H, W]``; ``pixel_attention_mask``
    only where some pixels are padding) and ``image_seq_len``. As transformers, all-zero
    tiles are the batch's padding and dropped."""
    pixels = outputs["pixel_values"].flatten(0, 1)
    masks = outputs.get("pixel_attention_mask")
    real = pixels.flatten(1).ne(0).any(dim=1)
    counts = outputs["tiles_per_image"].tolist()
    if len(counts) != count or sum(counts) != int(real.sum()):
        raise ValueError(
            f"the prompt's image placeholders show tiles {counts} for {count} images, "
            f"the processor made {int(real.sum())} tiles"
        )
    pixels = pixels[real].split(counts)
    masks = [None] * count if masks is None else masks.flatten(0, 1)[real].split(counts)
    return [
        tile_data(image_pixels, mask, outputs["image_seq_len"])
        for image_pixels, mask in zip(pixels, masks, strict=True)
    ]


def tile_data(
    pixels: torch.Tensor, mask: torch.Tensor | None, image_seq_len: torch.Tensor
) -> dict[str, torch.Tensor]:
    data = {"pixel_values": pixels.clone(), "image_seq_len": image_seq_len.clone()}
    if mask is not None and not bool(mask.all()):
        data["pixel_attention_mask"] = mask.bool()
    return data


def tile_features(data: Mapping[str, torch.Tensor]) -> int:
    """An image's placeholders: ``image_seq_len`` per tile."""
    return len(data["pixel_values"]) * int(data["image_seq_len"])
