"""LLaVA-NeXT (any-resolution tiles) on a tiny random checkpoint, against HF ``generate``.

The folder is written here: a tiny CLIP tower + projector + ``image_newline`` + Llama text
model, and the HF processor (``LlavaNextImageProcessor`` with 28-pixel tiles and grids of
1x2, 2x1 and 2x2 tiles). The images have different aspect ratios, so their tile grids,
the bands unpadding cuts (rows for a wide image, columns for a tall one) and their
placeholder counts differ. Greedy fp32 outputs must be token-identical to transformers:
one image, two images, text only; also with chunked prefill splitting the placeholder
ranges, preemption and recompute. Prefix-cache blocks are shared by the same image only.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from vision_testing import (
    BLOCK_BYTES,
    GREEDY,
    as_prompt,
    check_chunked_prefill_and_preemption,
    check_greedy_matches_hf,
    check_prefix_sharing,
    hf_greedy,
    image_start,
    random_image,
    randomize,
    tiny_llm,
    tiny_text,
    tiny_vision,
    token_ids,
)

TILE, PATCH = 28, 7  # 16 patches a tile
PINPOINTS = [[28, 56], [56, 28], [56, 56]]  # (height, width) of the tile grids

# wide: 1x2 tiles, rows unpadded (34 placeholders); tall: 2x2 tiles, columns unpadded
# (72); square: 2x2 tiles, nothing cut (88)
IMAGES = [random_image(1, 100, 30), random_image(2, 30, 45), random_image(3, 50, 50)]
CASES = [  # (prompt, images)
    ("<image>\nWhat is in this picture?", [IMAGES[0]]),
    ("Compare <image> with <image> please", [IMAGES[0], IMAGES[1]]),
    ("Hello there, how are you", []),
]


def build_llava_next(folder: Path, smol_folder: Path) -> Path:
    from transformers import (
        AutoTokenizer,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaNextConfig,
        LlavaNextForConditionalGeneration,
    )

    tokenizer = AutoTokenizer.from_pretrained(smol_folder)
    tokenizer.add_tokens(["<image>"], special_tokens=True)
    vision = CLIPVisionConfig(**tiny_vision(image_size=TILE, patch_size=PATCH))
    text = LlamaConfig(**tiny_text(tokenizer))
    config = LlavaNextConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        image_grid_pinpoints=PINPOINTS,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
    )
    torch.manual_seed(1234)
    model = LlavaNextForConditionalGeneration(config).eval()
    randomize(model)
    model.save_pretrained(folder)
    build_processor(tokenizer).save_pretrained(folder)
    return folder


def build_processor(tokenizer):
    from transformers import LlavaNextImageProcessor, LlavaNextProcessor

    image_processor = LlavaNextImageProcessor(
        size={"shortest_edge": TILE},
        crop_size={"height": TILE, "width": TILE},
        image_grid_pinpoints=PINPOINTS,
    )
    return LlavaNextProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=PATCH,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,  # the class token the tower adds (and LLaVA drops)
    )


@pytest.fixture(scope="module")
def llava_next_folder(tmp_path_factory, smol_folder) -> Path:
    return build_llava_next(tmp_path_factory.mktemp("llava_next"), smol_folder)


@pytest.fixture(scope="module")
def hf_reference(llava_next_folder):
    from transformers import LlavaNextForConditionalGeneration

    return hf_greedy(llava_next_folder, LlavaNextForConditionalGeneration)


@pytest.fixture(scope="module")
def llava_next(llava_next_folder):
    with tiny_llm(llava_next_folder) as llm:
        yield llm


def test_greedy_matches_hf_with_one_two_and_no_images(llava_next, hf_reference):
    check_greedy_matches_hf(llava_next, hf_reference, CASES, IMAGES[2])


def test_each_image_keeps_its_tiles_and_size(llava_next):
    processed = llava_next.engine.mm_processor.process(CASES[1][0], CASES[1][1])
    wide, tall = processed.images
    assert wide.pixel_values.shape == tall.pixel_values.shape == (5, 3, TILE, TILE)
    assert wide.data["image_sizes"].tolist() == [30, 100]
    assert tall.data["image_sizes"].tolist() == [45, 30]
    assert (wide.length, tall.length) == (34, 72)  # base 16 + unpadded grid + newlines


def test_chunked_prefill_inside_placeholders_and_preemption_match_hf(
    llava_next_folder, hf_reference
):
    cases = [*CASES, (CASES[0][0], [IMAGES[2]]), (CASES[1][0], [IMAGES[2], IMAGES[0]])]
    check_chunked_prefill_and_preemption(
        llava_next_folder,
        hf_reference,
        cases,
        max_model_len=160,  # the longest case: 131 prompt tokens + 12 new
        max_num_batched_tokens=16,  # every image's placeholders span chunks
        kv_cache_memory=12 * BLOCK_BYTES,
    )


def test_prefix_blocks_are_shared_by_the_same_image_only(llava_next, hf_reference):
    text = "Look at this: <image>\nDescribe the colours you see in it"  # block 0 ends mid-image
    # blocks that end inside the image are shared
    first = check_prefix_sharing(llava_next, hf_reference, text, IMAGES[:2], min_cached=32)
    start = image_start(llava_next, first)
    assert 0 < start < 16 < start + 34  # the first block ends inside the placeholders


@pytest.mark.parametrize("size", [(30, 100), (45, 30), (50, 50), (28, 64), (33, 29)])
def test_unpad_matches_transformers(size):
    from transformers.models.llava_next.modeling_llava_next import unpad_image

    from octavo.model_executor.models.llava_next import unpad

    picture = torch.arange(8 * 8 * 3, dtype=torch.float32).view(8, 8, 3)
    expected = unpad_image(picture.permute(2, 0, 1), torch.tensor(size)).permute(1, 2, 0)
    assert torch.equal(unpad(picture, list(size)), expected)


def test_mm_processor_kwargs_reach_every_processor_call(
    llava_next_folder, llava_next, hf_reference
):
    kwargs = {"do_normalize": False}  # vLLM's --mm-processor-kwargs, as JSON
    with tiny_llm(
        llava_next_folder,
        max_model_len=64,
        kv_cache_memory=8 * BLOCK_BYTES,
        mm_processor_kwargs=json.dumps(kwargs),
    ) as llm:
        outputs = llm.generate(as_prompt(*CASES[0]), GREEDY, use_tqdm=False)
        pixels = llm.engine.mm_processor.process(*CASES[0]).images[0].pixel_values
    assert token_ids(outputs) == [hf_reference(*CASES[0], **kwargs)]
    normalized = llava_next.engine.mm_processor.process(*CASES[0]).images[0].pixel_values
    assert pixels.min() >= 0 and normalized.min() < 0  # rescaled to [0, 1] only
