"""Gemma 3 with images (``Gemma3ForConditionalGeneration``) on a tiny random checkpoint,
against HF ``generate``.

The folder is written here: a tiny SigLIP tower (16 patches pooled to 4 image tokens),
the projector and a two-layer Gemma 3 decoder (a sliding layer, window 8, and a full one),
with ``Gemma3Processor`` (a tiny ``Gemma3ImageProcessor`` and the tests' tokenizer with
Gemma's image tokens). An image's placeholders attend to each other both ways: greedy fp32
outputs must be token-identical to transformers with one image, two images and none; with
a token budget that would split an image (the scheduler keeps it whole), preemption and
recompute; with a cached prefix that ends inside an image. The mask itself is checked
against transformers' for a step with two images.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from octavo.attention.metadata import AttentionMetadata
from octavo.attention.torch_ops import visible_keys
from octavo.entrypoints.llm import LLM
from octavo.model_executor.image_spans import bidirectional_spans
from octavo.multimodal.inputs import ImageInput
from octavo.multimodal.layouts import layout_of
from octavo.multimodal.processor import ProcessedPrompt
from octavo.scheduler.output import ScheduledSequence
from octavo.scheduler.whole_images import check_images_fit, whole_image_chunk
from vision_testing import (
    BLOCK_BYTES,
    GREEDY,
    as_prompt,
    check_greedy_matches_hf,
    check_prefix_sharing,
    data_url,
    hf_greedy,
    image_start,
    random_image,
    randomize,
    tiny_llm,
    tiny_text,
    tiny_vision,
    token_ids,
)

IMAGE_SIZE, PATCH, IMAGE_TOKENS = 28, 7, 4  # 16 patches, average-pooled 2x2 to 4 tokens
WINDOW = 8  # the sliding layer's window: shorter than the prompts
SPECIAL = {
    "boi_token": "<start_of_image>",
    "eoi_token": "<end_of_image>",
    "image_token": "<image_soft_token>",
}

IMAGES = [random_image(1, 40, 30), random_image(2, 28, 28), random_image(3, 33, 50)]
CASES = [  # (prompt, images)
    ("<start_of_image>What is in this picture?", [IMAGES[0]]),
    ("Compare <start_of_image> with <start_of_image> please", [IMAGES[0], IMAGES[1]]),
    ("Hello there, how are you", []),
]


def build_gemma3(folder: Path, smol_folder: Path) -> Path:
    from transformers import (
        AutoTokenizer,
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3ImageProcessor,
        Gemma3Processor,
    )

    tokenizer = AutoTokenizer.from_pretrained(smol_folder, extra_special_tokens=SPECIAL)
    vision = tiny_vision(image_size=IMAGE_SIZE, patch_size=PATCH)
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    text = tiny_text(
        tokenizer,
        head_dim=16,
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention"],
        query_pre_attn_scalar=24,
    )
    config = Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=IMAGE_TOKENS,
        boi_token_index=tokenizer.boi_token_id,
        eoi_token_index=tokenizer.convert_tokens_to_ids(SPECIAL["eoi_token"]),
        image_token_index=tokenizer.image_token_id,
        **ids,
    )
    torch.manual_seed(1234)
    model = Gemma3ForConditionalGeneration(config).float().eval()
    randomize(model)
    with torch.no_grad():  # the tied embedding, times sqrt(hidden), would drown the layers' output
        model.get_input_embeddings().weight.normal_(0.0, 0.02)
    model.save_pretrained(folder)
    image_processor = Gemma3ImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    processor = Gemma3Processor(
        image_processor=image_processor, tokenizer=tokenizer, image_seq_length=IMAGE_TOKENS
    )
    processor.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def gemma3_folder(tmp_path_factory, smol_folder) -> Path:
    return build_gemma3(tmp_path_factory.mktemp("gemma3_vision"), smol_folder)


@pytest.fixture(scope="module")
def hf_reference(gemma3_folder):
    from transformers import Gemma3ForConditionalGeneration

    return hf_greedy(gemma3_folder, Gemma3ForConditionalGeneration)


@pytest.fixture(scope="module")
def gemma3(gemma3_folder):
    with tiny_llm(gemma3_folder, limit_mm_per_prompt='{"image": 2}') as llm:
        yield llm


def test_greedy_matches_hf_with_one_two_and_no_images(gemma3, hf_reference):
    outputs = check_greedy_matches_hf(gemma3, hf_reference, CASES, IMAGES[2])
    first = outputs[0].prompt_token_ids
    soft = gemma3.engine.mm_processor.image_token_id  # <image_soft_token>, not <start_of_image>
    assert first.count(soft) == IMAGE_TOKENS


def test_chat_image_parts_become_start_of_image_and_match_hf(gemma3, hf_reference):
    """A template that does not loop over content parts gets the token a prompt writes
    per image (<start_of_image>), which the processor expands: not the soft token."""
    content = [
        {"type": "image_url", "image_url": {"url": data_url(IMAGES[0])}},
        {"type": "text", "text": "What is in this picture?"},
    ]
    outputs = gemma3.chat([{"role": "user", "content": content}], GREEDY, use_tqdm=False)
    rendered = gemma3.get_tokenizer().apply_chat_template(
        [{"role": "user", "content": "<start_of_image>\nWhat is in this picture?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert token_ids(outputs) == [hf_reference(rendered, [IMAGES[0]], add_special_tokens=False)]


def record_chunks(llm: LLM) -> list[tuple[int, int, list[ImageInput]]]:
    """Every chunk the scheduler plans from now on: (start, end, the sequence's images)."""
    scheduler, chunks = llm.engine.scheduler, []
    schedule = scheduler.schedule

    def recording():
        out = schedule()
        for seq in out.scheduled:
            start = seq.num_computed_tokens
            images = scheduler.seqs[seq.seq_id].images
            chunks.append((start, start + seq.num_new_tokens, images))
        return out

    scheduler.schedule = recording
    return chunks


def splits_an_image(start: int, end: int, images: list[ImageInput]) -> bool:
    return any(image.offset < end < image.end for image in images)


def test_a_budget_that_would_split_images_keeps_them_whole_with_preemption(
    gemma3_folder, hf_reference
):
    budget = 6
    cases = [*CASES[:2], (CASES[0][0], [IMAGES[2]]), (CASES[1][0], [IMAGES[2], IMAGES[0]])]
    expected = [hf_reference(text, images) for text, images in cases]
    with tiny_llm(
        gemma3_folder,
        max_model_len=64,
        max_num_batched_tokens=budget,
        kv_cache_memory=5 * BLOCK_BYTES,  # 4 blocks (and the null block): prompts preempted
    ) as llm:
        chunks = record_chunks(llm)
        outputs = llm.generate([as_prompt(*case) for case in cases], GREEDY, use_tqdm=False)
        assert token_ids(outputs) == expected
        assert llm.engine.stats().num_preemptions > 0
        too_big = ProcessedPrompt("", list(range(12)), [image_of(2, budget + 1)])
        with pytest.raises(ValueError, match="more than the 6 tokens of a step"):
            llm.engine.add_request("too-big", too_big, GREEDY)  # refused, not queued
        assert "too-big" not in llm.engine.requests
    images = [image for _, _, seq_images in chunks for image in seq_images]
    plain = [(start, start + budget) for start in range(0, 64, budget)]  # budget-sized chunks
    assert any(splits_an_image(start, end, images) for start, end in plain)
    assert not any(splits_an_image(start, end, seq_images) for start, end, seq_images in chunks)


def test_prefix_blocks_are_shared_by_the_same_image_only(gemma3, hf_reference):
    text = "Look at this picture that I took in the garden: <start_of_image> What is it?"
    # then the image's rest, whole, in the next chunk
    first = check_prefix_sharing(gemma3, hf_reference, text, IMAGES[:2], min_cached=16)
    start = image_start(gemma3, first)
    assert start < 16 < start + IMAGE_TOKENS  # the first block ends inside the image


def image_of(offset: int, length: int = IMAGE_TOKENS) -> ImageInput:
    return ImageInput(f"image-{offset}", offset, length, {})


def hf_masks(num_tokens: int, images: list[ImageInput]) -> dict[str, torch.Tensor]:
    """transformers' Gemma 3 masks ``[Q, K]`` (full and sliding layers) for a prompt."""
    from transformers import Gemma3TextConfig
    from transformers.models.gemma3.modeling_gemma3 import (
        create_masks_for_vision_model,
        get_block_sequence_ids_for_mask,
    )

    token_types = torch.zeros(1, num_tokens, dtype=torch.long)
    for image in images:
        token_types[0, image.offset : image.end] = 1
    config = Gemma3TextConfig(
        num_hidden_layers=2,
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention"],
    )
    config._attn_implementation = "sdpa"
    masks = create_masks_for_vision_model(
        config,
        torch.zeros(1, num_tokens, 8),
        None,
        None,
        torch.arange(num_tokens)[None],
        get_block_sequence_ids_for_mask(token_types),
    )
    return {name: mask[0, 0] for name, mask in masks.items()}


@pytest.mark.parametrize("computed", [0, 5, 13])  # whole prompt; prefix inside image 1, between
def test_bidirectional_mask_matches_hf_for_a_step_with_two_images(computed):
    num_tokens, images = 24, [image_of(3), image_of(10, 6)]
    chunk = ScheduledSequence(7, [0] * (num_tokens - computed), computed, [], True)
    (spans,) = bidirectional_spans([chunk], 1, {7: images})
    query_pos, key_pos = torch.arange(computed, num_tokens), torch.arange(num_tokens)
    expected = hf_masks(num_tokens, images)
    for window, name in [(None, "full_attention"), (WINDOW, "sliding_attention")]:
        got = visible_keys(query_pos, key_pos, window, spans)
        assert torch.equal(got, expected[name][computed:]), name
    plain = visible_keys(query_pos, key_pos, None)
    assert not torch.equal(plain, expected["full_attention"][computed:])


def test_spans_only_where_a_chunk_holds_an_image():
    images = {1: [image_of(3)], 2: [image_of(0, 1)]}
    text = ScheduledSequence(1, [0] * 3, 0, [], False)  # before the image
    single = ScheduledSequence(2, [0] * 4, 0, [], False)  # a one-token image: nothing to widen
    assert bidirectional_spans([text, single], 2, images) is None
    whole = ScheduledSequence(1, [0] * 5, 3, [], False)
    assert bidirectional_spans([whole, single], 2, images) == [[(3, 7)], []]


def prefill_metadata(num_tokens: int, spans: list | None) -> AttentionMetadata:
    """One prefill chunk of ``num_tokens`` (no cached prefix) in block 0."""
    return AttentionMetadata(
        slot_mapping=torch.arange(num_tokens),
        block_tables=torch.zeros(1, 1, dtype=torch.int32),
        seq_lens=torch.tensor([num_tokens], dtype=torch.int32),
        query_start_loc=torch.tensor([0, num_tokens], dtype=torch.int32),
        num_prefills=1,
        num_prefill_tokens=num_tokens,
        query_lens_list=[num_tokens],
        query_start_loc_list=[0],
        seq_lens_list=[num_tokens],
        max_seq_len=num_tokens,
        bidirectional_spans=spans,
    )


def test_the_triton_backend_attends_to_spans_on_the_torch_path():
    """Its prefill kernel is causal only: a step with spans takes the torch path (no
    kernel launch but the cache store, which runs here under Triton's interpreter)."""
    pytest.importorskip("triton")
    from octavo.attention.backend import TorchAttention
    from octavo.attention.triton_backend import TritonAttention

    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(10, h, 16, generator=generator) for h in (4, 2, 2))
    spans = [[(2, 6)]]
    outputs = []
    for backend in (TritonAttention(), TorchAttention()):
        cache = torch.zeros(2, 1, 16, 2, 16)
        meta = prefill_metadata(10, spans)
        outputs.append(backend.forward(query, key, value, cache, meta, 0.25))
    assert torch.equal(outputs[0], outputs[1])
    causal = TorchAttention().forward(
        query, key, value, torch.zeros(2, 1, 16, 2, 16), prefill_metadata(10, None), 0.25
    )
    assert not torch.equal(outputs[0], causal)


@pytest.mark.parametrize(
    ("start", "num_new", "most", "expected"),
    [
        (0, 6, 6, 3),  # would end inside [3, 7): stops before the image
        (0, 7, 9, 7),  # ends at the image's end
        (3, 2, 6, 4),  # starts at the image, fewer tokens asked (scoring rows): the image
        (3, 2, 3, 0),  # ... which the step cannot hold: nothing this step
        (5, 1, 6, 2),  # a cached prefix ends inside the image: its rest
        (7, 3, 3, 3),  # after the image
    ],
)
def test_whole_image_chunks(start, num_new, most, expected):
    assert whole_image_chunk([image_of(3), image_of(12)], start, num_new, most) == expected


def test_an_image_larger_than_a_step_is_refused():
    check_images_fit([image_of(0, 8)], 8)
    with pytest.raises(ValueError, match="9 placeholder tokens, more than the 8 tokens"):
        check_images_fit([image_of(0, 8), image_of(20, 9)], 8)


def test_pan_and_scan_crops_are_refused_by_name():
    """Crops add pixel rows and placeholder runs of their own: one clear error, not a
    miscount of placeholders."""
    layout = layout_of("Gemma3ForConditionalGeneration")
    pixels = torch.zeros(3, 3, IMAGE_SIZE, IMAGE_SIZE)
    split = layout.split({"pixel_values": pixels}, 3)
    assert [data["pixel_values"].shape for data in split] == [pixels.shape[1:]] * 3
    with pytest.raises(ValueError, match="do_pan_and_scan"):
        layout.split({"pixel_values": pixels}, 2)
