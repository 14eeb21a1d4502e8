"""Tiny random checkpoints with a Pixtral vision tower, and HF's greedy reference on them.

Two folders share the tower and the processor: Mistral 3 (patch merger by
``spatial_merge_size``) and Pixtral-12B's layout (``LlavaForConditionalGeneration`` with a
``pixtral`` vision config and LLaVA's projector, no merging). The processor is the real
``PixtralProcessor`` (tiny ``patch_size`` and ``longest_edge``) on the tests' tokenizer with
``[IMG]``, ``[IMG_BREAK]`` and ``[IMG_END]``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from PIL import Image

PATCH, LONGEST_EDGE = 4, 32  # at most 8x8 patches per image
NEW_TOKENS = 12
IMAGE_TOKENS = ["[IMG]", "[IMG_BREAK]", "[IMG_END]"]


def random_image(seed: int, width: int, height: int) -> Image.Image:
    generator = torch.Generator().manual_seed(seed)
    pixels = (torch.rand(height, width, 3, generator=generator) * 255).to(torch.uint8)
    return Image.fromarray(pixels.numpy())


def vision_config():
    from transformers import PixtralVisionConfig

    return PixtralVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=LONGEST_EDGE,
        patch_size=PATCH,
        hidden_act="silu",
    )


def text_config(tokenizer):
    from transformers import MistralConfig

    return MistralConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=len(tokenizer),
        max_position_embeddings=512,
        sliding_window=None,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )


def mistral3_config(tokenizer, merge: int):
    from transformers import Mistral3Config

    return Mistral3Config(
        vision_config=vision_config(),
        text_config=text_config(tokenizer),
        image_token_index=tokenizer.convert_tokens_to_ids("[IMG]"),
        spatial_merge_size=merge,
        vision_feature_layer=-1,
        tie_word_embeddings=False,
    )


def pixtral_llava_config(tokenizer):
    from transformers import LlavaConfig

    return LlavaConfig(
        vision_config=vision_config(),
        text_config=text_config(tokenizer),
        image_token_index=tokenizer.convert_tokens_to_ids("[IMG]"),
        vision_feature_layer=-1,
        vision_feature_select_strategy="full",
    )


def build_folder(folder: Path, smol_folder: Path, kind: str, merge: int = 1) -> Path:
    """``kind``: "mistral3" (merging ``merge``-squares of patches) or "llava" (Pixtral-12B's
    layout); random weights drawn large, so argmaxes are tie-free."""
    from transformers import AutoTokenizer, PixtralImageProcessor, PixtralProcessor

    tokenizer = AutoTokenizer.from_pretrained(smol_folder)
    tokenizer.add_tokens(IMAGE_TOKENS, special_tokens=True)
    if kind == "mistral3":
        config = mistral3_config(tokenizer, merge)
    else:
        config = pixtral_llava_config(tokenizer)
    torch.manual_seed(1234)
    model = hf_class(kind)(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.2)
    model.save_pretrained(folder)
    image_processor = PixtralImageProcessor(
        size={"longest_edge": LONGEST_EDGE}, patch_size={"height": PATCH, "width": PATCH}
    )
    PixtralProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=PATCH,
        spatial_merge_size=merge,
        chat_template=tokenizer.chat_template,
    ).save_pretrained(folder)
    return folder


def hf_class(kind: str):
    from transformers import LlavaForConditionalGeneration, Mistral3ForConditionalGeneration

    return Mistral3ForConditionalGeneration if kind == "mistral3" else LlavaForConditionalGeneration


def hf_greedy(folder: Path, kind: str) -> Callable[[str, list], list[int]]:
    """Greedy token ids transformers generates for (prompt, images), each computed once."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(folder)
    model = hf_class(kind).from_pretrained(folder, dtype=torch.float32).eval()
    done: dict[tuple, list[int]] = {}

    def generate(prompt: str, images: list) -> list[int]:
        inputs = processor(text=[prompt], images=images or None, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(
                **inputs,
                max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS,
                do_sample=False,
                pad_token_id=model.generation_config.eos_token_id,
            )
        return out[0, inputs["input_ids"].shape[1] :].tolist()

    def cached(prompt: str, images: list) -> list[int]:
        key = (prompt, tuple(map(id, images)))
        if key not in done:
            done[key] = generate(prompt, images)
        return done[key]

    return cached
