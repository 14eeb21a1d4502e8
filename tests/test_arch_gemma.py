"""Gemma 2 and Gemma 3 (and the text tower of Gemma 3's image-text checkpoints): greedy fp32
token identity with transformers on tiny random checkpoints transformers writes here.

Each checkpoint alternates a sliding layer (window of 24 tokens, shorter than the long
prompts) with a full one, and sets the scales that differ from Llama's to values that
matter at this size: ``query_pre_attn_scalar`` unlike ``head_dim``, Gemma 2's attention
and final logit soft-caps small enough to bend the scores, Gemma 3's global rope (base and
linear scaling) unlike its local one.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from architecture_check import (
    TINY_SIZES,
    assert_matches_hf,
    check_prompts,
    hf_reference,
    write_tiny_checkpoint,
)
from octavo import LLM, SamplingParams
from octavo.kernels import cpu_build
from octavo.kv_cache.cache_tensors import bytes_per_block
from octavo.model_executor.model_config import ModelConfig
from octavo.model_executor.models.registry import model_class

WINDOW = 24  # shorter than the long check prompts, so their sliding layers drop keys
LAYER_TYPES = ["sliding_attention", "full_attention"]
POOL_BLOCKS = 11  # architecture_check's pool: fewer blocks than the first batch needs
# Untied: a tied, sqrt(hidden)-scaled random embedding makes the model repeat its last
# token (the image-text checkpoint below keeps Gemma's tied embedding, scaled down).
GEMMA2 = {
    "tie_word_embeddings": False,
    "sliding_window": WINDOW,
    "layer_types": LAYER_TYPES,
    "query_pre_attn_scalar": 24,
    "attn_logit_softcapping": 4.0,
    "final_logit_softcapping": 8.0,
}
GEMMA3 = {
    "tie_word_embeddings": False,
    "sliding_window": WINDOW,
    "layer_types": LAYER_TYPES,
    "query_pre_attn_scalar": 24,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 4.0},
    },
}
# A Siglip tower of one small layer: 2x2 patches, 4 image tokens (never used by text).
TINY_VISION = {
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "image_size": 28,
    "patch_size": 14,
}


@pytest.fixture(scope="module")
def gemma2_folder(tmp_path_factory, smol_tokenizer):
    folder = tmp_path_factory.mktemp("gemma2")
    return write_tiny_checkpoint(folder, "gemma2", smol_tokenizer, **GEMMA2)


@pytest.fixture(scope="module")
def gemma3_folder(tmp_path_factory, smol_tokenizer):
    folder = tmp_path_factory.mktemp("gemma3")
    return write_tiny_checkpoint(folder, "gemma3_text", smol_tokenizer, **GEMMA3)


@pytest.fixture(scope="module")
def gemma2_reference(gemma2_folder, smol_tokenizer) -> list[list[int]]:
    """HF's greedy tokens for the check prompts (every Gemma 2 check compares with them)."""
    return hf_reference(gemma2_folder, check_prompts(smol_tokenizer))


@pytest.fixture(scope="module")
def gemma3_reference(gemma3_folder, smol_tokenizer) -> list[list[int]]:
    return hf_reference(gemma3_folder, check_prompts(smol_tokenizer))


def write_image_text_checkpoint(folder, tokenizer):
    """transformers' own Gemma3ForConditionalGeneration (tiny vision tower), seeded and
    widened as ``write_tiny_checkpoint``'s models are."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    text = {**TINY_SIZES, **GEMMA3, "tie_word_embeddings": True, "vocab_size": len(tokenizer)}
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    config = Gemma3Config(
        text_config={**text, **ids}, vision_config=TINY_VISION, mm_tokens_per_image=4, **ids
    )
    torch.manual_seed(1234)
    model = Gemma3ForConditionalGeneration(config).float()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.2)
        # The tied embedding, times sqrt(hidden), would drown the layers' output: the
        # random model would then repeat its last token. Smaller, the layers decide.
        model.get_input_embeddings().weight.normal_(0.0, 0.02)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_gemma2_matches_hf(gemma2_folder, gemma2_reference, smol_tokenizer):
    assert_matches_hf(gemma2_folder, smol_tokenizer, gemma2_reference)


def test_gemma2_prompt_logprobs_follow_the_final_soft_cap(gemma2_folder, smol_tokenizer):
    """Greedy tokens cannot see the final soft-cap (tanh keeps the logits' order); the
    logprobs of every token of a window-crossing prompt can."""
    from transformers import AutoModelForCausalLM

    prompt = check_prompts(smol_tokenizer)[1]
    params = SamplingParams(max_tokens=1, prompt_logprobs=1, temperature=0)
    with LLM(
        str(gemma2_folder), dtype="float32", max_model_len=320, kv_cache_memory=8 << 20
    ) as llm:
        (output,) = llm.generate([prompt], params, use_tqdm=False)
    got = torch.tensor([entry.logprob for entry in output.prompt_logprobs[1:]])
    hf = AutoModelForCausalLM.from_pretrained(gemma2_folder, dtype=torch.float32).eval()
    with torch.no_grad():
        capped = hf(torch.tensor([prompt])).logits[0, :-1]
    cap = GEMMA2["final_logit_softcapping"]
    uncapped = torch.atanh(capped / cap) * cap
    rows, targets = torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])
    expected = torch.log_softmax(capped, -1)[rows, targets]
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    assert (torch.log_softmax(uncapped, -1)[rows, targets] - expected).abs().max() > 0.1


def test_gemma2_on_the_torch_path_matches_hf(gemma2_folder, gemma2_reference, smol_tokenizer):
    """The soft-capped, windowed attention of the torch reference (no native kernel)."""
    cpu_build.use_torch_path()
    try:
        assert_matches_hf(gemma2_folder, smol_tokenizer, gemma2_reference)
    finally:
        cpu_build.use_torch_path(False)


def test_gemma3_matches_hf(gemma3_folder, gemma3_reference, smol_tokenizer):
    assert_matches_hf(gemma3_folder, smol_tokenizer, gemma3_reference)


@pytest.mark.parametrize("fixture", ["gemma2_folder", "gemma3_folder"])
def test_gemma_tensor_parallel_matches_hf(request, fixture, smol_tokenizer):
    """Two ranks, each with 2 of the 4 query heads and 1 of the 2 KV heads (so a worker's
    KV block takes half the bytes: the pool is halved to keep preemption forced)."""
    folder = request.getfixturevalue(fixture)
    expected = request.getfixturevalue(fixture.replace("_folder", "_reference"))
    block_bytes = bytes_per_block(ModelConfig.from_folder(folder), 16, torch.float32)
    kv_cache_memory = POOL_BLOCKS * block_bytes // 2
    assert_matches_hf(
        folder,
        smol_tokenizer,
        expected,
        tensor_parallel_size=2,
        kv_cache_memory=kv_cache_memory,
    )


def test_gemma3_image_text_checkpoint_serves_its_text_tower(tmp_path, smol_tokenizer):
    folder = write_image_text_checkpoint(tmp_path, smol_tokenizer)
    saved = json.loads((folder / "config.json").read_text())
    assert saved["architectures"] == ["Gemma3ForConditionalGeneration"]
    with safe_open(str(folder / "model.safetensors"), framework="pt") as reader:
        names = set(reader.keys())
    # transformers 5 writes the text tower as Google's files have it, the LM head tied
    assert "language_model.model.embed_tokens.weight" in names
    assert not any("lm_head" in name for name in names)
    assert any(name.startswith("vision_tower.") for name in names)  # in the folder, skipped
    assert_matches_hf(folder, smol_tokenizer)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "language_model.model.layers.3.self_attn.q_norm.weight",
            "model.layers.3.self_attn.q_norm.weight",
        ),
        ("model.language_model.embed_tokens.weight", "model.embed_tokens.weight"),
        ("language_model.lm_head.weight", "lm_head.weight"),
        ("lm_head.weight", "lm_head.weight"),
        (
            "vision_tower.encoder.layers.0.mlp.fc1.weight",
            "vision_tower.encoder.layers.0.mlp.fc1.weight",
        ),
        (
            "model.vision_tower.vision_model.post_layernorm.weight",
            "vision_tower.post_layernorm.weight",
        ),
        ("vision_tower.head.probe", None),  # SigLIP's pooling head: not Gemma 3's
        (
            "multi_modal_projector.mm_input_projection_weight",
            "multi_modal_projector.mm_input_projection_weight",
        ),
    ],
)
def test_image_text_checkpoint_names(name, expected):
    """Both spellings of the text tower (files and transformers' modules); the vision
    tower and projector (test_vision_gemma3.py) without SigLIP's pooling head."""
    assert model_class("Gemma3ForConditionalGeneration").checkpoint_name(name) == expected


def test_gemma3_rope_per_layer_type(gemma3_folder):
    """Sliding layers rotate with the local rope, full layers with the scaled global one."""
    config = ModelConfig.from_folder(gemma3_folder)
    model = model_class(config.architecture)(config)
    ropes = model.rope_parameters()
    assert ropes["sliding_attention"]["rope_theta"] == 10000.0
    assert ropes["sliding_attention"]["rope_type"] == "default"
    assert ropes["full_attention"]["rope_theta"] == 1000000.0
    assert (ropes["full_attention"]["rope_type"], ropes["full_attention"]["factor"]) == (
        "linear",
        4.0,
    )
    specs = [model.attention_spec(index) for index in range(config.num_layers)]
    assert [spec.rope for spec in specs] == LAYER_TYPES
    assert [spec.sliding_window for spec in specs] == [WINDOW, None]


def test_bidirectional_gemma3_is_refused(gemma3_folder):
    """EmbeddingGemma's bidirectional attention is not a causal LM: one clear error."""
    raw = json.loads((gemma3_folder / "config.json").read_text())
    config = ModelConfig.from_dict({**raw, "use_bidirectional_attention": True})
    with pytest.raises(ValueError, match="bidirectional"):
        model_class(config.architecture)(config)


# google/gemma-3-4b-it's config.json (transformers 4.50): the text tower lists only what
# differs from Gemma3TextConfig's defaults, and no file of Google's names tie_word_embeddings.
GEMMA3_4B = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "eos_token_id": [1, 106],
    "mm_tokens_per_image": 256,
    "text_config": {
        "model_type": "gemma3_text",
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "vision_config": {"model_type": "siglip_vision_model", "vision_use_head": False},
}


def test_a_sparse_text_config_takes_transformers_defaults():
    config = ModelConfig.from_dict(GEMMA3_4B)
    shape = (config.num_heads, config.num_kv_heads, config.head_dim, config.vocab_size)
    assert shape == (8, 4, 256, 262208)
    assert config.tie_word_embeddings and config.eos_token_ids == (1, 106)
    assert config.layer_types[4:7] == ("sliding_attention", "full_attention", "sliding_attention")
    assert config.rope["rope_type"] == "linear" and config.rope["factor"] == 8.0


def test_a_gemma_config_without_tie_word_embeddings_ties():
    raw = {
        "architectures": ["Gemma2ForCausalLM"],
        "model_type": "gemma2",
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 128,
    }
    assert ModelConfig.from_dict(raw).tie_word_embeddings
    llama = {**raw, "architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    assert not ModelConfig.from_dict(llama).tie_word_embeddings
