"""Mistral 3 (Pixtral vision tower, patch-merging projector, Mistral decoder) on a tiny random
checkpoint, against HF ``generate``.

The folder is written here (``pixtral_checkpoints``): a tiny Pixtral tower + Mistral 3
projector + Mistral text model, and the ``PixtralProcessor`` (tiny ``patch_size`` and
``longest_edge``; the tests' tokenizer with ``[IMG]``, ``[IMG_BREAK]`` and ``[IMG_END]``).
Images keep their own sizes, so one image's placeholders are one ``[IMG]`` run per feature
row with ``[IMG_BREAK]`` between (text tokens inside the image's span). Greedy fp32 outputs
must be token-identical to transformers on the processor's inputs: one image, two images
of different sizes, text only; also with chunked prefill cutting an image's span,
preemption and recompute. Prefix-cache blocks are shared by the same image only.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pixtral_checkpoints import build_folder, pixtral_reference
from vision_testing import (
    BLOCK_BYTES,
    check_chunked_prefill_and_preemption,
    check_greedy_matches_hf,
    check_prefix_sharing,
    image_start,
    random_image,
    tiny_llm,
)

MERGE = 2  # 2x2 patches per feature: at most 4x4 features per image

# width x height 40x30 -> 32x24 pixels: 3 rows of 4 features; 20x28 and 33x50 -> 24x32:
# 4 rows of 3 features
IMAGES = [random_image(1, 40, 30), random_image(2, 20, 28), random_image(3, 33, 50)]
CASES = [  # (prompt, images)
    ("[IMG]\nWhat is in this picture?", [IMAGES[0]]),
    ("Compare [IMG] with [IMG] please", [IMAGES[0], IMAGES[1]]),
    ("Hello there, how are you", []),
]


@pytest.fixture(scope="module")
def mistral3_folder(tmp_path_factory, smol_folder) -> Path:
    return build_folder(tmp_path_factory.mktemp("mistral3"), smol_folder, "mistral3", MERGE)


@pytest.fixture(scope="module")
def hf_reference(mistral3_folder):
    return pixtral_reference(mistral3_folder, "mistral3")


@pytest.fixture(scope="module")
def mistral3(mistral3_folder):
    with tiny_llm(mistral3_folder, limit_mm_per_prompt={"image": 2}) as llm:
        yield llm


def test_greedy_matches_hf_with_one_two_and_no_images(mistral3, hf_reference):
    check_greedy_matches_hf(mistral3, hf_reference, CASES, IMAGES[2])


def test_an_images_span_has_its_row_breaks_as_text(mistral3):
    processed = mistral3.engine.mm_processor.process(CASES[1][0], CASES[1][1])
    first, second = processed.images
    assert (first.num_features, first.length) == (12, 14)  # 3 rows of 4, 2 breaks between
    assert (second.num_features, second.length) == (12, 15)  # 4 rows of 3, 3 breaks between
    assert first.embed_mask.tolist()[:6] == [True] * 4 + [False, True]
    assert first.pixel_values.shape == (3, 24, 32)  # its own pixels, not the batch's padding
    assert second.pixel_values.shape == (3, 32, 24)


def test_chunked_prefill_inside_an_image_and_preemption_match_hf(mistral3_folder, hf_reference):
    cases = [*CASES, (CASES[0][0], [IMAGES[2]]), (CASES[1][0], [IMAGES[2], IMAGES[0]])]
    check_chunked_prefill_and_preemption(
        mistral3_folder,
        hf_reference,
        cases,
        max_model_len=128,
        max_num_batched_tokens=8,  # every image's span (14 or 15 tokens) is cut by chunks
        kv_cache_memory=9 * BLOCK_BYTES,
    )


def test_prefix_blocks_are_shared_by_the_same_image_only(mistral3, hf_reference):
    text = "Look at this picture: [IMG]\nDescribe the colours you see in it"
    # the rest of the image comes from the encoder cache
    first = check_prefix_sharing(mistral3, hf_reference, text, IMAGES[:2], min_cached=16)
    start = image_start(mistral3, first)
    assert 0 < start < 16 < start + 14  # the first block ends inside the image's span
