"""Pixtral-12B's layout (``LlavaForConditionalGeneration`` with a ``pixtral`` vision config):
the Pixtral tower under LLaVA's projector, one ``[IMG]`` per patch (no merging), rows
broken by ``[IMG_BREAK]``, against HF ``generate`` on a tiny random checkpoint.

One engine whose 8-token steps cut every image's span (chunked prefill inside the rows and
breaks): one image, two images of different sizes, text only, token-identical in fp32.
"""

from __future__ import annotations

from octavo import SamplingParams
from octavo.entrypoints.llm import LLM
from pixtral_checkpoints import NEW_TOKENS, build_folder, hf_greedy, random_image

GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
KV_BYTES = 32 * (2 * 16 * 2 * 16 * 4 * 2)  # 32 blocks of 16 tokens (K+V, 2 heads of 16, fp32)
# width x height 24x16 -> 6 rows of 4 patches; 13x30 -> 16x32: 8 rows of 4 patches
IMAGES = [random_image(4, 16, 24), random_image(5, 13, 30)]
CASES = [
    ("[IMG]\nWhat is in this picture?", [IMAGES[0]]),
    ("Compare [IMG] with [IMG] please", IMAGES),
    ("Hello there, how are you", []),
]


def test_pixtral_llava_greedy_matches_hf_with_chunks_inside_images(tmp_path, smol_folder):
    folder = build_folder(tmp_path, smol_folder, "llava")
    expected = [hf_greedy(folder, "llava")(text, images) for text, images in CASES]
    with LLM(
        str(folder),
        dtype="float32",
        max_model_len=256,
        max_num_batched_tokens=8,
        kv_cache_memory=KV_BYTES,
    ) as llm:
        first = llm.engine.mm_processor.process(*CASES[0]).images[0]
        assert (first.num_features, first.length) == (24, 29)  # 6 rows of 4, 5 breaks
        outputs = llm.generate(
            [
                {"prompt": text, "multi_modal_data": {"image": images}} if images else text
                for text, images in CASES
            ],
            GREEDY,
            use_tqdm=False,
        )
    assert [output.outputs[0].token_ids for output in outputs] == expected
