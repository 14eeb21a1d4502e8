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
from PIL import Image

from octavo import SamplingParams
from octavo.entrypoints.llm import LLM

TILE, PATCH = 28, 7  # 16 patches a tile
PINPOINTS = [[28, 56], [56, 28], [56, 56]]  # (height, width) of the tile grids
NEW_TOKENS = 12
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
# K+V, 16-token blocks, 2 KV heads of 16, fp32, 2 layers
BLOCK_BYTES = 2 * 16 * 2 * 16 * 4 * 2
SMALL_KV = 64 * BLOCK_BYTES  # 1024 tokens (not the CPU default of 2 GiB per engine)


def random_image(seed: int, width: int, height: int) -> Image.Image:
    generator = torch.Generator().manual_seed(seed)
    pixels = (torch.rand(height, width, 3, generator=generator) * 255).to(torch.uint8)
    return Image.fromarray(pixels.numpy())


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
    vision = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=TILE,
        patch_size=PATCH,
    )
    text = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=len(tokenizer),
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
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
    with torch.no_grad():
        for parameter in model.parameters():  # larger weights: sharper, tie-free argmaxes
            parameter.normal_(0.0, 0.2)
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
    """Greedy token ids transformers generates for (prompt, images, processor kwargs)."""
    from transformers import AutoProcessor, LlavaNextForConditionalGeneration

    processor = AutoProcessor.from_pretrained(llava_next_folder)
    model = LlavaNextForConditionalGeneration.from_pretrained(
        llava_next_folder, dtype=torch.float32
    ).eval()
    done: dict[tuple, list[int]] = {}

    def generate(prompt: str, images: list, **kwargs) -> list[int]:
        inputs = processor(text=[prompt], images=images or None, return_tensors="pt", **kwargs)
        with torch.no_grad():
            out = model.generate(
                **inputs,
                max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS,
                do_sample=False,
                pad_token_id=model.generation_config.eos_token_id,
            )
        return out[0, inputs["input_ids"].shape[1] :].tolist()

    def cached(prompt: str, images: list, **kwargs) -> list[int]:
        key = (prompt, tuple(map(id, images)), tuple(sorted(kwargs.items())))
        if key not in done:
            done[key] = generate(prompt, images, **kwargs)
        return done[key]

    return cached


@pytest.fixture(scope="module")
def llava_next(llava_next_folder):
    with LLM(
        str(llava_next_folder), dtype="float32", max_model_len=256, kv_cache_memory=SMALL_KV
    ) as llm:
        yield llm


def as_prompt(text: str, images: list) -> str | dict:
    return {"prompt": text, "multi_modal_data": {"image": images}} if images else text


def token_ids(outputs) -> list[list[int]]:
    return [output.outputs[0].token_ids for output in outputs]


def test_greedy_matches_hf_with_one_two_and_no_images(llava_next, hf_reference):
    expected = [hf_reference(text, images) for text, images in CASES]
    outputs = llava_next.generate([as_prompt(*case) for case in CASES], GREEDY, use_tqdm=False)
    assert token_ids(outputs) == expected
    other = llava_next.generate(as_prompt(CASES[0][0], [IMAGES[2]]), GREEDY, use_tqdm=False)
    assert token_ids(other) != expected[:1]  # the image, not only the text, decides


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
    expected = [hf_reference(text, images) for text, images in cases]
    with LLM(
        str(llava_next_folder),
        dtype="float32",
        max_model_len=160,  # the longest case: 131 prompt tokens + 12 new
        max_num_batched_tokens=16,  # every image's placeholders span chunks
        kv_cache_memory=12 * BLOCK_BYTES,
    ) as llm:
        outputs = llm.generate([as_prompt(*case) for case in cases], GREEDY, use_tqdm=False)
        assert token_ids(outputs) == expected
        assert llm.engine.stats().num_preemptions > 0
        cache = llm.engine.executor.worker.runner.encoder_cache
        assert cache.hits > 0  # later chunks (and recomputes) took the features cached


def test_prefix_blocks_are_shared_by_the_same_image_only(llava_next, hf_reference):
    text = "Look at this: <image>\nDescribe the colours you see in it"  # block 0 ends mid-image
    first = llava_next.generate(as_prompt(text, [IMAGES[0]]), GREEDY, use_tqdm=False)[0]
    other = llava_next.generate(as_prompt(text, [IMAGES[1]]), GREEDY, use_tqdm=False)[0]
    same = llava_next.generate(as_prompt(text, [IMAGES[0].copy()]), GREEDY, use_tqdm=False)[0]
    start = first.prompt_token_ids.index(llava_next.engine.mm_processor.image_token_id)
    assert 0 < start < 16 < start + 34  # the first block ends inside the placeholders
    assert other.num_cached_tokens == 0
    assert same.num_cached_tokens >= 32  # blocks that end inside the image are shared
    assert (
        same.outputs[0].token_ids == first.outputs[0].token_ids == hf_reference(text, [IMAGES[0]])
    )


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
    with LLM(
        str(llava_next_folder),
        dtype="float32",
        max_model_len=64,
        kv_cache_memory=8 * BLOCK_BYTES,
        mm_processor_kwargs=json.dumps(kwargs),
    ) as llm:
        outputs = llm.generate(as_prompt(*CASES[0]), GREEDY, use_tqdm=False)
        pixels = llm.engine.mm_processor.process(*CASES[0]).images[0].pixel_values
    assert token_ids(outputs) == [hf_reference(*CASES[0], **kwargs)]
    normalized = llava_next.engine.mm_processor.process(*CASES[0]).images[0].pixel_values
    assert pixels.min() >= 0 and normalized.min() < 0  # rescaled to [0, 1] only
