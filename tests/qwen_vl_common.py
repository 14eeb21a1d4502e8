"""What the Qwen-VL tests share beyond ``vision_testing``: the prompt's image and the
tokenizer's vision tokens."""

from __future__ import annotations

from pathlib import Path

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"


def vision_tokenizer(smol_folder: Path):
    """The tests' tokenizer with Qwen's vision tokens added."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smol_folder)
    tokenizer.add_tokens(VISION_TOKENS, special_tokens=True)
    return tokenizer


def vision_token_ids(tokenizer) -> dict[str, int]:
    """The config's ids of the vision tokens."""
    ids = tokenizer.convert_tokens_to_ids
    return {
        "image_token_id": ids("<|image_pad|>"),
        "video_token_id": ids("<|video_pad|>"),
        "vision_start_token_id": ids("<|vision_start|>"),
        "vision_end_token_id": ids("<|vision_end|>"),
    }
