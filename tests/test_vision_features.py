"""The language model keeps its features when the prompt has images (LLaVA's tiny
checkpoint): tensor parallelism, a LoRA adapter on the text tower (equal to HF + peft),
structured output, and n-gram speculation (the same greedy tokens as HF's)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from octavo import LoRARequest, SamplingParams
from octavo.structured_output.params import StructuredOutputsParams
from test_vision_llava import CASES, IMAGES, build_llava
from vision_testing import GREEDY, as_prompt, greedy_reference, tiny_llm, token_ids

NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_min": 1,
    "prompt_lookup_max": 3,
}
# Llama's names only: CLIP's attention has q/k/v_proj too, its output is out_proj, its MLP fc1/fc2.
TEXT_TOWER_MODULES = ["o_proj", "gate_proj", "up_proj", "down_proj"]
REGEX = r"[a-f]{3}-[0-9]{2,4}"
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["ok", "n"],
}


@pytest.fixture(scope="module")
def llava_folder(tmp_path_factory, smol_folder) -> Path:
    return even_vocabulary(build_llava(tmp_path_factory.mktemp("llava"), smol_folder))


def even_vocabulary(folder: Path) -> Path:
    """One more (never written) token row: 49153 rows do not split over two ranks."""
    model = hf_llava(folder)
    rows = model.get_input_embeddings().weight.shape[0]
    model.resize_token_embeddings(rows + 1, mean_resizing=False)
    with torch.no_grad():
        model.get_input_embeddings().weight[-1].normal_(0.0, 0.2)
        model.get_output_embeddings().weight[-1].normal_(0.0, 0.2)
    model.save_pretrained(folder)
    return folder


def hf_llava(folder: Path):
    from transformers import LlavaForConditionalGeneration

    return LlavaForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()


def make_text_adapter(base: Path, folder: Path, seed: int) -> Path:
    """A peft LoRA adapter (random, non-zero A and B) on the decoder's layers only."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=4, lora_alpha=8, target_modules=TEXT_TOWER_MODULES, lora_dropout=0.0)
    model = get_peft_model(hf_llava(base), config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def references(llava_folder, tmp_path_factory):
    """HF's greedy tokens without and with the adapter, and the adapter's folder."""
    from peft import PeftModel
    from transformers import AutoProcessor

    adapter = make_text_adapter(llava_folder, tmp_path_factory.mktemp("adapter"), seed=5)
    processor = AutoProcessor.from_pretrained(llava_folder)
    base = greedy_reference(processor, hf_llava(llava_folder))
    tuned = PeftModel.from_pretrained(hf_llava(llava_folder), adapter).eval()
    return base, greedy_reference(processor, tuned), adapter


@pytest.fixture(scope="module")
def llava(llava_folder):
    """One rank, LoRA enabled and n-gram speculation on."""
    options = {"enable_lora": True, "max_lora_rank": 8, "speculative_config": NGRAM}
    with tiny_llm(llava_folder, limit_mm_per_prompt='{"image": 2}', **options) as llm:
        yield llm


def test_ngram_speculation_with_images_keeps_hf_greedy_tokens(llava, references):
    base, _, _ = references
    outputs = llava.generate([as_prompt(*case) for case in CASES], GREEDY, use_tqdm=False)
    assert token_ids(outputs) == [base(text, images) for text, images in CASES]
    assert llava.engine.scheduler.spec_counters.num_draft_tokens > 0  # it did speculate


def test_a_text_tower_lora_adapter_with_images_matches_hf_peft(llava, references):
    base, tuned, adapter = references
    request = LoRARequest("text", 1, str(adapter))
    text, images = CASES[0]
    (out,) = llava.generate(as_prompt(text, images), GREEDY, use_tqdm=False, lora_request=request)
    assert out.outputs[0].token_ids == tuned(text, images)
    assert out.outputs[0].token_ids != base(text, images)  # the adapter changes the answer


def test_structured_output_with_an_image_is_honoured(llava):
    text, images = CASES[0]
    constraints = [StructuredOutputsParams(regex=REGEX), StructuredOutputsParams(json=SCHEMA)]
    params = [
        SamplingParams(temperature=0.0, max_tokens=40, structured_outputs=constraint)
        for constraint in constraints
    ]
    prompts = [as_prompt(text, images)] * 2
    pattern, answer = (
        out.outputs[0].text for out in llava.generate(prompts, params, use_tqdm=False)
    )
    assert re.fullmatch(REGEX, pattern)
    reply = json.loads(answer)
    assert isinstance(reply["ok"], bool) and 0 <= reply["n"] <= 9


def test_tensor_parallel_2_with_images_equals_one_rank(llava_folder, llava):
    prompts = [as_prompt(*case) for case in [*CASES, ("<image> and", [IMAGES[2]])]]
    one_rank = token_ids(llava.generate(prompts, GREEDY, use_tqdm=False))
    with tiny_llm(llava_folder, limit_mm_per_prompt='{"image": 2}', tensor_parallel_size=2) as tp:
        assert token_ids(tp.generate(prompts, GREEDY, use_tqdm=False)) == one_rank
