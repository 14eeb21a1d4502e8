"""Qwen3-VL (images in, text out, interleaved M-RoPE, DeepStack) on a tiny random
checkpoint, against HF.

The folder is written here: a tiny Qwen3-VL vision transformer (three blocks, learned
position embeddings resampled per image, DeepStack mergers after blocks 0 and 1) + a
Qwen 3 text model whose rope frequencies alternate between the temporal, height and
width positions, and the HF processor (patch 16, merge 2, tiny min/max pixels). Greedy
fp32 outputs must be token-identical to transformers on the processor's inputs: one
image, two images of different sizes, text only; also with chunked prefill splitting an
image's placeholders (and so its DeepStack rows) and preemption. The interleaved rotary
tables are checked against transformers' own.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from qwen_vl_common import IMAGE, vision_token_ids, vision_tokenizer
from vision_testing import (
    BLOCK_BYTES,
    check_chunked_prefill_and_preemption,
    check_greedy_matches_hf,
    hf_greedy,
    random_image,
    randomize,
    tiny_llm,
    tiny_text,
)

MROPE_SECTION = [4, 2, 2]  # of head_dim 16's 8 frequencies: t h w t h w t t

# 6x8 patches of 16 pixels (12 features), 6x4 (6 features), 4x6 (6 features)
IMAGES = [random_image(1, 128, 96), random_image(2, 64, 96), random_image(3, 96, 64)]
CASES = [  # (prompt, images)
    (f"{IMAGE}What is in this picture?", [IMAGES[0]]),
    (f"Compare {IMAGE} with {IMAGE} please", [IMAGES[0], IMAGES[1]]),
    ("Hello there, how are you", []),
]


def build_qwen3_vl(folder: Path, smol_folder: Path) -> Path:
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    tokenizer = vision_tokenizer(smol_folder)
    rope = {"rope_type": "default", "mrope_section": MROPE_SECTION}
    text = tiny_text(tokenizer, head_dim=16, rope_parameters=rope)
    vision = {
        "depth": 3,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": 64,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "num_position_embeddings": 16,  # a 4x4 learned grid, resampled per image
        "deepstack_visual_indexes": [0, 1],
    }
    config = Qwen3VLConfig(text_config=text, vision_config=vision, **vision_token_ids(tokenizer))
    torch.manual_seed(1234)
    model = Qwen3VLForConditionalGeneration(config).eval()
    randomize(model)
    model.save_pretrained(folder)
    image_processor = Qwen2VLImageProcessorPil(
        min_pixels=32 * 32, max_pixels=128 * 128, patch_size=16, merge_size=2
    )
    processor = Qwen3VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=Qwen3VLVideoProcessor(),
        chat_template=tokenizer.chat_template,
    )
    processor.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def qwen3_folder(tmp_path_factory, smol_folder) -> Path:
    return build_qwen3_vl(tmp_path_factory.mktemp("qwen3_vl"), smol_folder)


@pytest.fixture(scope="module")
def hf_reference(qwen3_folder):
    from transformers import Qwen3VLForConditionalGeneration

    return hf_greedy(qwen3_folder, Qwen3VLForConditionalGeneration)


@pytest.fixture(scope="module")
def qwen3(qwen3_folder):
    with tiny_llm(qwen3_folder) as llm:
        yield llm


def test_greedy_matches_hf_with_one_two_and_no_images(qwen3, hf_reference):
    check_greedy_matches_hf(qwen3, hf_reference, CASES, IMAGES[2])


def test_chunked_prefill_inside_placeholders_and_preemption_match_hf(qwen3_folder, hf_reference):
    cases = [*CASES, (CASES[0][0], [IMAGES[2]]), (CASES[1][0], [IMAGES[2], IMAGES[0]])]
    check_chunked_prefill_and_preemption(
        qwen3_folder,
        hf_reference,
        cases,
        cache_hits=False,  # as before: this test asserts no encoder-cache hits
        max_model_len=64,
        max_num_batched_tokens=8,  # a 12-feature image's placeholders span chunks
        kv_cache_memory=7 * BLOCK_BYTES,
    )


def test_interleaved_mrope_tables_match_hf_rotary():
    from transformers import Qwen3VLTextConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

    from octavo.model_executor.mrope_rotary import MRotaryEmbedding

    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": MROPE_SECTION}
    config = Qwen3VLTextConfig(hidden_size=64, head_dim=16, rope_parameters=rope)
    positions = torch.randint(0, 200, (3, 9), generator=torch.Generator().manual_seed(0))
    hf_cos, hf_sin = Qwen3VLTextRotaryEmbedding(config)(torch.zeros(1), positions[:, None])
    ours = MRotaryEmbedding(16, 256, rope, torch.float32, torch.device("cpu"), interleaved=True)
    cos, sin = ours.step_rows(positions)
    torch.testing.assert_close(cos, hf_cos[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(sin, hf_sin[0], rtol=0, atol=1e-6)
