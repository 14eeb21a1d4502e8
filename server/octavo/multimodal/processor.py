"""A prompt with images as the engine takes it: the model folder's HF ``AutoProcessor``
expands the prompt (one placeholder token per image feature) and makes the pixels.

As vLLM, the processor runs on the prompt's text and its images together; the expanded
token ids go to the scheduler, and each image becomes an ``ImageInput`` holding its
placeholder range and content hash. ``--limit-mm-per-prompt`` caps the images a prompt
may carry.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from octavo.multimodal.images import image_hash, load_image
from octavo.multimodal.inputs import ImageInput, placeholder_runs, placeholder_spans
from octavo.multimodal.layouts import ImageLayout, layout_of
from octavo.multimodal.limits import DEFAULT_IMAGE_LIMIT, MODALITIES

logger = logging.getLogger(__name__)
# A folder's HF processor settings (transformers 4 and 5 write one or both)
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")


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

    def __init__(
        self,
        folder: Path,
        layout: ImageLayout,
        limits: dict[str, int] | None = None,
        call_kwargs: dict[str, Any] | None = None,
    ) -> None:
        from transformers import AutoProcessor

        self.hf = AutoProcessor.from_pretrained(folder, trust_remote_code=False)
        self.layout = layout.for_processor(self.hf)
        placeholder = self.layout.placeholder
        self.image_token: str = str(placeholder(self.hf) if placeholder else self.hf.image_token)
        self.image_token_id: int = self.hf.tokenizer.convert_tokens_to_ids(self.image_token)
        # What a prompt writes per image, which the processor expands (Gemma 3: its
        # <start_of_image>; the expanded placeholders are <image_soft_token>s)
        self.prompt_image_token: str = str(self.hf.image_token)
        self.max_images = (limits or {}).get("image", DEFAULT_IMAGE_LIMIT)
        self.call_kwargs = dict(call_kwargs or {})  # --mm-processor-kwargs

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
            **self.call_kwargs,
        )
        token_ids = outputs["input_ids"][0].tolist()
        if images and self.layout.extra_outputs is not None:
            outputs = {**outputs, **self.layout.extra_outputs(self.hf, outputs)}
        per_image = self.layout.split(outputs, len(images)) if images else []
        spans = self.placeholder_spans(token_ids, per_image)
        inputs = [
            ImageInput(image_hash(image), offset, length, data, mask)
            for image, data, (offset, length, mask) in zip(images, per_image, spans, strict=True)
        ]
        return ProcessedPrompt(text, token_ids, inputs)

    def placeholder_spans(
        self, token_ids: list[int], per_image: list[dict]
    ) -> list[tuple[int, int, object]]:
        """(offset, length, embed_mask) of each image's placeholders in the prompt."""
        if self.layout.feature_count is not None:
            counts = [self.layout.feature_count(data) for data in per_image]
            return placeholder_spans(token_ids, self.image_token_id, counts)
        runs = placeholder_runs(token_ids, self.image_token_id)
        if len(runs) != len(per_image):
            raise ValueError(
                f"the prompt has {len(runs)} image placeholders ({self.image_token}) for "
                f"{len(per_image)} images: put one {self.prompt_image_token} where each image goes"
            )
        return [(offset, length, None) for offset, length in runs]


def processor_for(
    folder: Path,
    architecture: str,
    takes_images: bool,
    limits: dict[str, int] | None,
    call_kwargs: dict[str, Any] | None = None,
) -> MultiModalProcessor | None:
    """The processor of a model that takes images (``call_kwargs``: what
    ``--mm-processor-kwargs`` adds to each call); None for a text-only model, and for a
    folder without an HF processor (Gemma 3's text tower saved alone: text prompts only)."""
    if not takes_images:
        return None
    if not any((folder / name).is_file() for name in PROCESSOR_FILES):
        logger.warning("%s has no HF processor (%s): text prompts only", folder, PROCESSOR_FILES)
        return None
    return MultiModalProcessor(folder, layout_of(architecture), limits, call_kwargs)
