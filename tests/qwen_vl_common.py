"""What the Qwen-VL tests share: images, prompts, the tokenizer's vision tokens and a
cached greedy HF reference."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from PIL import Image

from octavo import SamplingParams

NEW_TOKENS = 12
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
# K+V, 16-token blocks, 2 KV heads of 16, fp32, 2 layers
BLOCK_BYTES = 2 * 16 * 2 * 16 * 4 * 2
SMALL_KV = 64 * BLOCK_BYTES  # 1024 tokens (not the CPU default of 2 GiB per engine)
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"


def random_image(seed: int, width: int, height: int) -> Image.Image:
    generator = torch.Generator().manual_seed(seed)
    pixels = (torch.rand(height, width, 3, generator=generator) * 255).to(torch.uint8)
    return Image.fromarray(pixels.numpy())


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


def randomize(model) -> None:
    """Larger weights than the init's: sharper, tie-free argmaxes."""
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.2)


def greedy_reference(processor, model) -> Callable[[str, list], list[int]]:
    """Greedy token ids transformers generates for (prompt, images), each computed once."""
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


def as_prompt(text: str, images: list) -> str | dict:
    return {"prompt": text, "multi_modal_data": {"image": images}} if images else text


def token_ids(outputs) -> list[list[int]]:
    return [output.outputs[0].token_ids for output in outputs]
