"""The vision benchmark's default model: a random-weight Qwen2.5-VL folder, written here.

Throughput does not depend on what the weights say (the benchmark runs greedy with
``ignore_eos``), so a small random checkpoint of Qwen2.5-VL's design lets Octavo, HF and
vLLM run the same folder on two CPU cores in minutes: a Qwen 2 decoder of 6 layers (hidden
512, 8 heads of 64, 2 KV heads, M-RoPE split 8/12/12) and a 4-block vision tower (hidden
256, 4 heads, window attention with the last block full, 2x2 patch merger), the embedded
SmolLM2 tokenizer with Qwen's vision tokens, and the Qwen2-VL image processor (patch 14:
a 336x336 image is 576 patches, 144 placeholder tokens). Its processors need
torchvision, in vLLM's venv too (``make vllm-venv`` installs it).
"""

from __future__ import annotations

from pathlib import Path

import torch

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
MROPE_SECTION = [8, 12, 12]  # of head_dim 64's 32 rotary frequencies
TEXT_SHAPE = {
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 6,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
}
VISION_SHAPE = {
    "depth": 4,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_heads": 4,
    "out_hidden_size": 512,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 112,  # 4x4 merge units per window, as Qwen2.5-VL's own
    "fullatt_block_indexes": [3],
}


def vision_token_ids(tokenizer) -> dict[str, int]:
    ids = tokenizer.convert_tokens_to_ids
    return {
        "image_token_id": ids("<|image_pad|>"),
        "video_token_id": ids("<|video_pad|>"),
        "vision_start_token_id": ids("<|vision_start|>"),
        "vision_end_token_id": ids("<|vision_end|>"),
    }


def vision_tokenizer():
    """The embedded SmolLM2 tokenizer with Qwen's vision tokens added."""
    from octavo.model_executor.embedded import embedded_model_folder
    from octavo.model_executor.model_folders import load_tokenizer

    tokenizer = load_tokenizer(embedded_model_folder())
    tokenizer.add_tokens(VISION_TOKENS, special_tokens=True)
    return tokenizer


def qwen2_5_vl_config(tokenizer):
    from transformers import Qwen2_5_VLConfig

    rope = {"rope_type": "default", "mrope_section": MROPE_SECTION}
    text = {
        **TEXT_SHAPE,
        "vocab_size": len(tokenizer),
        "rope_parameters": {**rope, "rope_theta": TEXT_SHAPE["rope_theta"]},
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    return Qwen2_5_VLConfig(
        text_config=text,
        vision_config=VISION_SHAPE,
        tie_word_embeddings=True,
        **vision_token_ids(tokenizer),
    )


def build_qwen2_5_vl(target: Path) -> Path:
    """``target`` with the random Qwen2.5-VL checkpoint and processor (kept if there)."""
    from transformers import (
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
        Qwen2VLImageProcessor,
    )
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    if (target / "config.json").is_file():
        return target
    tokenizer = vision_tokenizer()
    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(qwen2_5_vl_config(tokenizer))
    model.to(torch.bfloat16).save_pretrained(target)
    processor = Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(),
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(),
        chat_template=tokenizer.chat_template,
    )
    processor.save_pretrained(target)
    return target
