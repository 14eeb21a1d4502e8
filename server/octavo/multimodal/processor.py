"""A prompt with images as the engine takes it: the model folder's HF ``AutoProcessor``
expands the prompt (one placeholder token per image feature) and makes the pixels.

As vLLM, the processor runs on the prompt's text and its images together; the expanded
token ids go to the scheduler, and each image becomes an ``ImageInput`` holding its
placeholder range and content hash. ``--limit-mm-per-prompt`` caps the images a prompt
may carry.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from octavo.multimodal.images import image_hash, load_image
from octavo.multimodal.inputs import ImageInput, placeholder_runs
from octavo.multimodal.limits import DEFAULT_IMAGE_LIMIT, MODALITIES


@dataclass
class ProcessedPrompt:
    text: str
    token_ids: list[int]
    images: list[ImageInput]


def image_list(multi_modal_data: Any) -> list:
    """The images of a prompt's ``multi_modal_data`` (``{"image": img | [img, ...]}``)."""
    if not isinstance(multi_modal_data, dict):
        raise ValueError('multi_modal_data must be a dict such as {"image": [image, ...]}')
    unknown = sorted(set(multi_modal_data) - set(MODALITIES))
    if unknown:
        raise ValueError(f"multi_modal_data: unsupported modalities {unknown}; use 'image'")
    images = multi_modal_data.get("image", [])
    return list(images) if isinstance(images, list | tuple) else [images]


class MultiModalProcessor:
    """The model's HF processor, with the engine's image limit."""

    def __init__(self, folder: Path, limits: dict[str, int] | None = None) -> None:
        from transformers import AutoProcessor

        self.hf = AutoProcessor.from_pretrained(folder, trust_remote_code=False)
        self.image_token: str = self.hf.image_token
        self.image_token_id: int = self.hf.tokenizer.convert_tokens_to_ids(self.image_token)
        self.max_images = (limits or {}).get("image", DEFAULT_IMAGE_LIMIT)

    def check_count(self, count: int) -> None:
        if count > self.max_images:
            raise ValueError(
                f"the prompt has {count} images, more than the {self.max_images} allowed "
                f"(--limit-mm-per-prompt '{{\"image\": {self.max_images}}}')"
            )

    def process(self, text: str, sources: list, add_special_tokens: bool = True) -> ProcessedPrompt:
        """Decode the images, run the processor, and find each image's placeholders."""
        self.check_count(len(sources))
        images = [load_image(source, index) for index, source in enumerate(sources)]
        outputs = self.hf(
            text=[text],
            images=images or None,
            return_tensors="pt",
            add_special_tokens=add_special_tokens,
        )
        token_ids = outputs["input_ids"][0].tolist()
        runs = placeholder_runs(token_ids, self.image_token_id)
        if len(runs) != len(images):
            raise ValueError(
                f"the prompt has {len(runs)} image placeholders ({self.image_token}) for "
                f"{len(images)} images: put one {self.image_token} where each image goes"
            )
        pixels = outputs["pixel_values"] if images else []
        inputs = [
            ImageInput(image_hash(image), offset, length, pixels[index])
            for index, (image, (offset, length)) in enumerate(zip(images, runs, strict=True))
        ]
        return ProcessedPrompt(text, token_ids, inputs)


def processor_for(
    folder: Path, takes_images: bool, limits: dict[str, int] | None
) -> MultiModalProcessor | None:
    """The processor of a model that takes images; None for a text-only model."""
    return MultiModalProcessor(folder, limits) if takes_images else None
