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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from octavo.multimodal.sized_images import feature_grids, sized_features, split_sized
from octavo.multimodal.tiles import split_tiles, tile_counts, tile_features

if TYPE_CHECKING:
    import torch

Split = Callable[[Mapping[str, "torch.Tensor"], int], list[dict[str, "torch.Tensor"]]]
# (the HF processor, its outputs) -> more tensors for the split
Extra = Callable[[Any, Mapping[str, "torch.Tensor"]], dict[str, "torch.Tensor"]]


def stacked(*keys: str) -> Split:
    """Tensors whose first dimension is the image: image ``i`` takes row ``i`` of each."""

    def split(outputs: Mapping[str, torch.Tensor], count: int) -> list[dict[str, torch.Tensor]]:
        present = [key for key in keys if key in outputs]
        return [{key: outputs[key][index] for key in present} for index in range(count)]

    return split


def by_patch_grid(outputs: Mapping[str, torch.Tensor], count: int) -> list[dict[str, torch.Tensor]]:
    """Patches flattened over all images (Qwen-VL): image ``i`` takes its ``t * h * w``
    rows of ``pixel_values`` and its row of ``image_grid_thw``."""
    grids = outputs["image_grid_thw"]
    pixels = outputs["pixel_values"].split(grids.prod(dim=-1).tolist())
    return [{"pixel_values": pixels[i], "image_grid_thw": grids[i]} for i in range(count)]


def uncropped(outputs: Mapping[str, torch.Tensor], count: int) -> list[dict[str, torch.Tensor]]:
    """Gemma 3: one ``pixel_values`` row per image (``stacked``); pan-and-scan crops (more
    rows, each with its own placeholder run) are refused."""
    if outputs["pixel_values"].shape[0] != count:
        raise ValueError(
            "Gemma 3's pan-and-scan crops (do_pan_and_scan) are not supported: "
            "leave do_pan_and_scan off in --mm-processor-kwargs"
        )
    return stacked("pixel_values")(outputs, count)


def tokenizer_image_token(hf_processor: Any) -> str:
    """The tokenizer's ``image_token``: the placeholder where the processor's is another."""
    return str(hf_processor.tokenizer.image_token)


@dataclass(frozen=True)
class ImageLayout:
    split: Split
    # Placeholder tokens of one image from its tensors; None: each image's placeholders
    # are one unbroken run, found in the expanded prompt.
    feature_count: Callable[[dict[str, torch.Tensor]], int] | None = None
    # Tensors the split needs beyond the processor's outputs, read with the processor at
    # hand (Idefics3's tiles per image, from the expanded prompt); None: none.
    extra_outputs: Extra | None = None
    # Another layout for a folder whose HF processor is of another class (by class name):
    # Pixtral-12B is a LlavaForConditionalGeneration with Pixtral's processor.
    by_processor: dict[str, ImageLayout] = field(default_factory=dict)
    # The token the expanded prompt holds per feature, read from the HF processor; None:
    # its ``image_token`` (Gemma 3's names <start_of_image>, the tokenizer's the soft token).
    placeholder: Callable[[Any], str] | None = None

    def for_processor(self, hf_processor: Any) -> ImageLayout:
        """The layout of ``hf_processor``'s outputs."""
        return self.by_processor.get(type(hf_processor).__name__, self)


# Pixtral's processor: pixel_values padded to the largest image, image_sizes (H, W);
# [IMG] per (merged) patch, row by row, [IMG_BREAK]/[IMG_END] between the rows
_SIZED = ImageLayout(split_sized, sized_features, feature_grids)

# Idefics3 / SmolVLM: every image's tiles in one [1, tiles, C, H, W], counted per image
# from the prompt; an image's placeholders are image_seq_len per tile, with text between.
_TILES = ImageLayout(split_tiles, tile_features, tile_counts)


LAYOUTS: dict[str, ImageLayout] = {
    "LlavaForConditionalGeneration": ImageLayout(
        stacked("pixel_values"), by_processor={"PixtralProcessor": _SIZED}
    ),
    "Idefics3ForConditionalGeneration": _TILES,
    "SmolVLMForConditionalGeneration": _TILES,
    # pixel_values [images, tiles, C, H, W], padded to the most tiles; image_sizes (H, W)
    "LlavaNextForConditionalGeneration": ImageLayout(stacked("pixel_values", "image_sizes")),
    "Mistral3ForConditionalGeneration": _SIZED,
    # Qwen2.5-VL: every image's patches in one [patches, C*T*P*P] beside image_grid_thw
    # [images, 3]; one <|image_pad|> per merged patch, one run per image
    "Qwen2_5_VLForConditionalGeneration": ImageLayout(by_patch_grid),
    "Qwen3VLForConditionalGeneration": ImageLayout(by_patch_grid),
    # Gemma 3: pixel_values [images, C, H, W]; <start_of_image>, mm_tokens_per_image x
    # <image_soft_token> (the tokenizer's image_token), <end_of_image>
    "Gemma3ForConditionalGeneration": ImageLayout(uncropped, placeholder=tokenizer_image_token),
}


def layout_of(architecture: str) -> ImageLayout:
    if architecture not in LAYOUTS:
        raise ValueError(f"no image layout for {architecture}")
    return LAYOUTS[architecture]
