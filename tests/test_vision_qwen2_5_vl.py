"""Qwen2.5-VL (images in, text out, M-RoPE) on a tiny random checkpoint, against HF.

The folder is written here: a tiny Qwen2.5-VL vision transformer (two blocks, one with
window attention, one full) + a Qwen 2 text model whose rope is split 2/3/3 between the
temporal, height and width positions, and the HF processor (Qwen2-VL image processor with
tiny min/max pixels, patch 14, merge 2; the tests' tokenizer with Qwen's vision tokens).
Greedy fp32 outputs must be token-identical to transformers on the processor's inputs: one
image, two images of different sizes, text only; also with chunked prefill splitting an
image's placeholders, preemption and recompute (the 3-D positions taken again). The 3-D
positions, the rotary tables and the tower's window order are checked against
transformers' own functions.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from qwen_vl_common import IMAGE, vision_token_ids, vision_tokenizer
from vision_testing import (
    BLOCK_BYTES,
    GREEDY,
    NEW_TOKENS,
    as_prompt,
    check_chunked_prefill_and_preemption,
    check_greedy_matches_hf,
    greedy_reference,
    random_image,
    randomize,
    tiny_llm,
    tiny_text,
    token_ids,
)

MROPE_SECTION = [2, 3, 3]  # of head_dim 16's 8 rotary frequencies

# 6x8 patches (12 features, 4 windows), 6x4 (6 features), 4x6 (6 features)
IMAGES = [random_image(1, 112, 84), random_image(2, 56, 84), random_image(3, 84, 56)]
CASES = [  # (prompt, images)
    (f"{IMAGE}What is in this picture?", [IMAGES[0]]),
    (f"Compare {IMAGE} with {IMAGE} please", [IMAGES[0], IMAGES[1]]),
    ("Hello there, how are you", []),
]


def build_qwen2_5_vl(folder: Path, smol_folder: Path) -> Path:
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
    )
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    tokenizer = vision_tokenizer(smol_folder)
    rope = {"rope_type": "default", "mrope_section": MROPE_SECTION}
    text = tiny_text(tokenizer, rope_parameters=rope)
    vision = {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": 64,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "window_size": 56,  # 2x2 merge units per window
        "fullatt_block_indexes": [1],
    }
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, **vision_token_ids(tokenizer))
    torch.manual_seed(1234)
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    randomize(model)
    model.save_pretrained(folder)
    processor = Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=112 * 112),
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(),
        chat_template=tokenizer.chat_template,
    )
    processor.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def qwen_folder(tmp_path_factory, smol_folder) -> Path:
    return build_qwen2_5_vl(tmp_path_factory.mktemp("qwen2_5_vl"), smol_folder)


@pytest.fixture(scope="module")
def hf_model(qwen_folder):
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

    processor = AutoProcessor.from_pretrained(qwen_folder)
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(qwen_folder, dtype=torch.float32)
    return processor, model.eval()


@pytest.fixture(scope="module")
def hf_reference(hf_model):
    return greedy_reference(*hf_model)


@pytest.fixture(scope="module")
def qwen(qwen_folder):
    with tiny_llm(qwen_folder) as llm:
        yield llm


def test_greedy_matches_hf_with_one_two_and_no_images(qwen, hf_reference):
    check_greedy_matches_hf(qwen, hf_reference, CASES, IMAGES[2])
    again = qwen.generate(as_prompt(*CASES[0]), GREEDY, use_tqdm=False)[0]
    assert again.num_cached_tokens >= 16  # prefix blocks of the same image, same positions
    assert again.outputs[0].token_ids == hf_reference(*CASES[0])


def test_chunked_prefill_inside_placeholders_and_preemption_match_hf(qwen_folder, hf_reference):
    cases = [*CASES, (CASES[0][0], [IMAGES[2]]), (CASES[1][0], [IMAGES[2], IMAGES[0]])]
    check_chunked_prefill_and_preemption(
        qwen_folder,
        hf_reference,
        cases,
        max_model_len=64,
        max_num_batched_tokens=8,  # a 12-feature image's placeholders span chunks
        kv_cache_memory=7 * BLOCK_BYTES,
    )


def test_prompt_positions_match_hf_get_rope_index(qwen, hf_model):
    from octavo.model_executor.mrope_positions import prompt_positions

    processor, model = hf_model
    text = f"{IMAGE} and {IMAGE}, then {IMAGE} at last"
    inputs = processor(text=[text], images=IMAGES, return_tensors="pt")
    expected, delta = model.model.get_rope_index(
        inputs["input_ids"], inputs["mm_token_type_ids"], inputs["image_grid_thw"]
    )
    prompt = qwen.engine.process_multimodal(text, {"image": IMAGES})
    grids = qwen.engine.executor.worker.runner.model.mrope_grids(prompt.images)
    ours = prompt_positions(len(prompt.token_ids), grids)
    assert prompt.token_ids == inputs["input_ids"][0].tolist()
    assert torch.equal(ours.positions, expected[:, 0])
    assert ours.delta == int(delta) < 0


def test_step_positions_take_the_prompt_slice_then_position_plus_delta():
    from octavo.model_executor.mrope_positions import FeatureGrid, MRopePositions
    from octavo.scheduler.output import ScheduledSequence

    grid = FeatureGrid(offset=2, t=1, h=2, w=3)
    model = type("Model", (), {"mrope_grids": lambda self, images: [grid]})()
    state = MRopePositions(model)
    data = type("Data", (), {"seq_id": 7, "images": [object()], "prompt_token_ids": [0] * 10})
    state.add(data)
    prompt = state.prompts[7]  # text at 0 1, the grid from 2 (to 3, 4), text at 5 6
    assert prompt.positions[:, -1].tolist() == [6, 6, 6] and prompt.delta == -3
    chunk = ScheduledSequence(7, [0] * 6, num_computed_tokens=6, block_ids=[0], sample=True)
    decode = ScheduledSequence(8, [0], num_computed_tokens=4, block_ids=[0], sample=True)
    flat = [*range(6, 12), 4]
    positions = state.step_positions([chunk, decode], [0, 6], flat)
    assert positions[:, :4].tolist() == prompt.positions[:, 6:10].tolist()
    assert positions[:, 4:6].tolist() == [[7, 8]] * 3  # generated: position + delta
    assert positions[:, 6].tolist() == [4, 4, 4]  # a sequence without images: plain


def test_mrope_tables_match_hf_rotary():
    from transformers import Qwen2_5_VLTextConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLRotaryEmbedding

    from octavo.model_executor.mrope_rotary import MRotaryEmbedding

    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": MROPE_SECTION}
    config = Qwen2_5_VLTextConfig(hidden_size=64, num_attention_heads=4, rope_parameters=rope)
    positions = torch.randint(0, 200, (3, 9), generator=torch.Generator().manual_seed(0))
    hf_cos, hf_sin = Qwen2_5_VLRotaryEmbedding(config)(torch.zeros(1), positions[:, None])
    ours = MRotaryEmbedding(16, 256, rope, torch.float32, torch.device("cpu"))
    cos, sin = ours.step_rows(positions)
    torch.testing.assert_close(cos, hf_cos[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(sin, hf_sin[0], rtol=0, atol=1e-6)


def test_window_order_and_patch_coordinates_match_hf():
    from transformers.vision_utils import get_vision_position_ids, get_vision_window_index

    from octavo.model_executor.vision.qwen_windows import patch_coordinates, window_plan

    grids = [(1, 6, 8), (1, 8, 4), (2, 4, 4)]
    thw = torch.tensor(grids)
    order, cu_windows = get_vision_window_index(thw, 2, 56, 14)  # 2 units per window side
    plan = window_plan(grids, merge=2, window=2)
    assert torch.equal(plan.order, order)
    assert [0, *torch.tensor(plan.window_lengths).cumsum(0).tolist()] == cu_windows.tolist()
    assert plan.frame_lengths == [48, 32, 16, 16]
    assert torch.equal(patch_coordinates(grids, 2), get_vision_position_ids(thw, 2))


def test_decode_graphs_take_the_3d_positions(qwen, hf_reference):
    from octavo.model_executor.decode_graphs import DecodeGraphs
    from test_decode_graphs import RerunRecorder  # a CPU stand-in for CUDA graph capture

    runner = qwen.engine.executor.worker.runner
    recorder = RerunRecorder()
    graphs = DecodeGraphs(runner.paged, [1, 4], 256, recorder)
    graphs.capture()
    assert graphs.buffers.positions.shape == (3, 4)
    runner.graphs = graphs
    try:
        cases = [(CASES[1][0], [IMAGES[1], IMAGES[2]]), CASES[2]]  # not in the prefix cache
        outputs = qwen.generate([as_prompt(*case) for case in cases], GREEDY, use_tqdm=False)
    finally:
        runner.graphs = None
    assert recorder.replays >= NEW_TOKENS - 1  # every decode step replayed
    assert token_ids(outputs) == [hf_reference(*case) for case in cases]
