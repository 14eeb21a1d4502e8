"""SmolVLM / Idefics3 (tiles + a global image) on a tiny random checkpoint, against HF.

The folder is written here: a tiny Idefics3 vision tower (16-pixel tiles of 4x4 patches),
the pixel-shuffle connector (scale 2: 4 features a tile) and a Llama text model, saved as
``SmolVLMForConditionalGeneration`` with the ``Idefics3Processor`` (SmolVLM's own
processor is the same for images but needs ``num2words``). Images are resized to a
32-pixel longest edge and cut into 16-pixel tiles: a 4:3 image is 2x2 tiles + the global
one (20 placeholders), a 3:1 image 1x2 + global (12). Between an image's tile runs the
prompt has text (``<fake_token_around_image><row_1_col_2>``, newlines). Greedy fp32
outputs must be token-identical to transformers: one image, two images, text only; with
chunked prefill cutting the images' spans (inside runs and in the text between them) and
preemption; prefix blocks shared by the same image only.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vision_testing import (
    BLOCK_BYTES,
    GREEDY,
    NEW_TOKENS,
    as_prompt,
    check_chunked_prefill_and_preemption,
    check_greedy_matches_hf,
    check_prefix_sharing,
    hf_greedy,
    random_image,
    randomize,
    tiny_llm,
    tiny_text,
    tiny_vision,
    token_ids,
)

TILE, PATCH, SCALE = 16, 4, 2  # 16 patches a tile, 4 features after the pixel shuffle
IMAGE_SEQ_LEN = (TILE // PATCH) ** 2 // SCALE**2

# 2x2 tiles + global (5 tiles), 1x2 + global (3), 2x2 + global (5)
IMAGES = [random_image(1, 40, 30), random_image(2, 60, 20), random_image(3, 33, 50)]
CASES = [  # (prompt, images)
    ("<image>\nWhat is in this picture?", [IMAGES[0]]),
    ("Compare <image> with <image> please", [IMAGES[0], IMAGES[1]]),
    ("Hello there, how are you", []),
]


def build_smolvlm(folder: Path, smol_folder: Path) -> Path:
    from transformers import (
        AutoTokenizer,
        Idefics3ImageProcessor,
        Idefics3Processor,
        Idefics3VisionConfig,
        LlamaConfig,
        SmolVLMConfig,
        SmolVLMForConditionalGeneration,
    )

    tokenizer = AutoTokenizer.from_pretrained(smol_folder)
    image_processor = Idefics3ImageProcessor(
        size={"longest_edge": 2 * TILE}, max_image_size={"longest_edge": TILE}
    )
    processor = Idefics3Processor(  # adds <fake_token_around_image>, <image> to the tokenizer
        image_processor=image_processor, tokenizer=tokenizer, image_seq_len=IMAGE_SEQ_LEN
    )
    vision = Idefics3VisionConfig(**tiny_vision(image_size=TILE, patch_size=PATCH))
    text = LlamaConfig(**tiny_text(tokenizer))
    config = SmolVLMConfig(
        vision_config=vision.to_dict(),
        text_config=text.to_dict(),
        scale_factor=SCALE,
        image_token_id=processor.image_token_id,
    )
    torch.manual_seed(1234)
    model = SmolVLMForConditionalGeneration(config).eval()
    randomize(model)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def smolvlm_folder(tmp_path_factory, smol_folder) -> Path:
    return build_smolvlm(tmp_path_factory.mktemp("smolvlm"), smol_folder)


@pytest.fixture(scope="module")
def hf_reference(smolvlm_folder):
    from transformers import SmolVLMForConditionalGeneration

    return hf_greedy(smolvlm_folder, SmolVLMForConditionalGeneration)


@pytest.fixture(scope="module")
def smolvlm(smolvlm_folder):
    with tiny_llm(smolvlm_folder) as llm:
        yield llm


def test_greedy_matches_hf_with_one_two_and_no_images(smolvlm, hf_reference):
    check_greedy_matches_hf(smolvlm, hf_reference, CASES, IMAGES[2])


def test_each_image_gets_its_own_tiles_and_masked_span(smolvlm):
    processor = smolvlm.engine.mm_processor
    prompt = processor.process(CASES[1][0], CASES[1][1])
    first, second = prompt.images
    assert [len(image.pixel_values) for image in prompt.images] == [5, 3]
    assert [image.num_features for image in prompt.images] == [5 * 4, 3 * 4]
    assert first.embed_mask is not None and second.embed_mask is not None
    assert first.length > first.num_features  # markers and newlines between the tile runs
    assert first.end < second.offset


def test_chunked_prefill_inside_spans_and_preemption_match_hf(smolvlm_folder, hf_reference):
    cases = [CASES[1], CASES[0], (CASES[0][0], [IMAGES[2]])]  # 8 + 6 + 6 blocks of 10
    check_chunked_prefill_and_preemption(
        smolvlm_folder,
        hf_reference,
        cases,
        max_model_len=160,
        max_num_batched_tokens=8,  # chunks end inside tile runs and in the text between
        kv_cache_memory=11 * BLOCK_BYTES,
    )


def test_prefix_blocks_are_shared_by_the_same_image_only(smolvlm, hf_reference):
    text = "Look: <image>\nDescribe the colours you see in it"  # block 0 ends mid-image
    first = check_prefix_sharing(smolvlm, hf_reference, text, IMAGES[:2], min_cached=16)
    placeholders = [
        position
        for position, token in enumerate(first.prompt_token_ids)
        if token == smolvlm.engine.mm_processor.image_token_id
    ]
    assert 0 < placeholders[0] < 16 < placeholders[-1]  # the first block ends in the image


def test_split_drops_padding_tiles_and_gives_each_image_its_own():
    from octavo.multimodal.tiles import split_tiles, tile_features

    pixels = torch.randn(1, 6, 3, TILE, TILE)
    pixels[0, 5] = 0.0  # a padding tile (a batch's shorter prompt): transformers drops it
    mask = torch.ones(1, 6, TILE, TILE, dtype=torch.long)
    mask[0, 1, :, 8:] = 0  # image 0's second tile is half padding
    outputs = {
        "pixel_values": pixels,
        "pixel_attention_mask": mask,
        "tiles_per_image": torch.tensor([3, 2]),
        "image_seq_len": torch.tensor(IMAGE_SEQ_LEN),
    }
    first, second = split_tiles(outputs, 2)
    assert torch.equal(first["pixel_values"], pixels[0, :3])
    assert torch.equal(second["pixel_values"], pixels[0, 3:5])
    assert torch.equal(first["pixel_attention_mask"], mask[0, :3].bool())
    assert "pixel_attention_mask" not in second  # no padding: the tower needs no mask
    assert [tile_features(first), tile_features(second)] == [3 * 4, 2 * 4]
    with pytest.raises(ValueError, match=r"tiles \[3, 3\] for 2 images, the processor made 5"):
        split_tiles({**outputs, "tiles_per_image": torch.tensor([3, 3])}, 2)


def test_tower_and_connector_match_hf_on_padded_and_small_tiles():
    from transformers import Idefics3Config, Idefics3VisionConfig
    from transformers.models.idefics3.modeling_idefics3 import (
        Idefics3Connector as HFConnector,
    )
    from transformers.models.idefics3.modeling_idefics3 import Idefics3VisionTransformer as HF

    from octavo.model_executor.models.idefics3 import pixel_shuffle
    from octavo.model_executor.vision.idefics3 import Idefics3VisionTransformer

    # 7x7 position grid; tiles of 6x6 patches bucket onto it
    vision = Idefics3VisionConfig(**tiny_vision(image_size=28, patch_size=PATCH))
    torch.manual_seed(0)
    hf = HF(vision).eval()
    ours = Idefics3VisionTransformer(vision)
    ours.load_state_dict(hf.state_dict())
    pixels = torch.randn(2, 3, 24, 24)
    mask = torch.ones(2, 24, 24, dtype=torch.bool)
    mask[1, 13:, :] = False  # padding rows (partial patches count as real, as in HF)
    patch_mask = mask.unfold(1, PATCH, PATCH).unfold(2, PATCH, PATCH).sum(dim=(-1, -2)) > 0
    with torch.no_grad():
        expected = hf(pixels, patch_attention_mask=patch_mask).last_hidden_state
        got = ours(pixels, mask)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    connector = HFConnector(Idefics3Config(vision_config=vision.to_dict(), scale_factor=3))
    patches = torch.randn(2, 36, 32)
    assert torch.equal(pixel_shuffle(patches, 3), connector.pixel_shuffle(patches, 3))


def as_idefics3(smolvlm_folder: Path, folder: Path) -> Path:
    """The same checkpoint under Idefics3's names (transformers' Idefics3 classes)."""
    import json
    import shutil

    shutil.copytree(smolvlm_folder, folder, dirs_exist_ok=True)
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["Idefics3ForConditionalGeneration"]
    config["model_type"] = "idefics3"
    config["vision_config"]["model_type"] = "idefics3_vision"
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_an_idefics3_checkpoint_matches_hf(smolvlm_folder, tmp_path):
    from transformers import AutoProcessor, Idefics3ForConditionalGeneration

    folder = as_idefics3(smolvlm_folder, tmp_path / "idefics3")
    text, images = CASES[1]
    inputs = AutoProcessor.from_pretrained(folder)(text=[text], images=images, return_tensors="pt")
    model = Idefics3ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(
            **inputs, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False
        )
    expected = out[0, inputs["input_ids"].shape[1] :].tolist()
    with tiny_llm(folder) as llm:
        outputs = llm.generate(as_prompt(text, images), GREEDY, use_tqdm=False)
    assert token_ids(outputs) == [expected]
