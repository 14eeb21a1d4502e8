"""Tiny random checkpoints with a Pixtral vision tower, and HF's greedy reference on them.

Two folders share the tower and the processor: Mistral 3 (patch merger by
``spatial_merge_size``) and Pixtral-12B's layout (``LlavaForConditionalGeneration`` with a
``pixtral`` vision config and LLaVA's projector, no merging). The processor is the real
``PixtralProcessor`` (tiny ``patch_size`` and ``longest_edge``) on the tests' tokenizer with
``[IMG]``, ``[IMG_BREAK]`` and ``[IMG_END]``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from vision_testing import Reference, hf_greedy, randomize, tiny_text, tiny_vision

PATCH, LONGEST_EDGE = 4, 32  # at most 8x8 patches per image
IMAGE_TOKENS = ["[IMG]", "[IMG_BREAK]", "[IMG_END]"]


def vision_config():
    from transformers import PixtralVisionConfig

    return PixtralVisionConfig(
        **tiny_vision(image_size=LONGEST_EDGE, patch_size=PATCH, hidden_act="silu")
    )


def text_config(tokenizer):
    from transformers import MistralConfig

    return MistralConfig(**tiny_text(tokenizer, head_dim=16, sliding_window=None))


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
    randomize(model)
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


def pixtral_reference(folder: Path, kind: str) -> Reference:
    """Greedy token ids transformers generates for (prompt, images), each computed once."""
    return hf_greedy(folder, hf_class(kind))
