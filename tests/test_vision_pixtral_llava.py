"""Pixtral-12B's layout (``LlavaForConditionalGeneration`` with a ``pixtral`` vision config):
the Pixtral tower under LLaVA's projector, one ``[IMG]`` per patch (no merging), rows
broken by ``[IMG_BREAK]``, against HF ``generate`` on a tiny random checkpoint.

One engine whose 8-token steps cut every image's span (chunked prefill inside the rows and
breaks): one image, two images of different sizes, text only, token-identical in fp32.
"""

from __future__ import annotations

from pixtral_checkpoints import build_folder, pixtral_reference
from vision_testing import BLOCK_BYTES, GREEDY, as_prompt, random_image, tiny_llm, token_ids

# width x height 24x16 -> 6 rows of 4 patches; 13x30 -> 16x32: 8 rows of 4 patches
IMAGES = [random_image(4, 16, 24), random_image(5, 13, 30)]
CASES = [
    ("[IMG]\nWhat is in this picture?", [IMAGES[0]]),
    ("Compare [IMG] with [IMG] please", IMAGES),
    ("Hello there, how are you", []),
]


def test_pixtral_llava_greedy_matches_hf_with_chunks_inside_images(tmp_path, smol_folder):
    folder = build_folder(tmp_path, smol_folder, "llava")
    reference = pixtral_reference(folder, "llava")
    expected = [reference(text, images) for text, images in CASES]
    with tiny_llm(folder, max_num_batched_tokens=8, kv_cache_memory=32 * BLOCK_BYTES) as llm:
        first = llm.engine.mm_processor.process(*CASES[0]).images[0]
        assert (first.num_features, first.length) == (24, 29)  # 6 rows of 4, 5 breaks
        outputs = llm.generate([as_prompt(*case) for case in CASES], GREEDY, use_tqdm=False)
    assert token_ids(outputs) == expected
