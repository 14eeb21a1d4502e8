"""GGUF files of the registered architectures beyond Llama/Qwen2/Mistral: a tiny random
transformers checkpoint written as llama.cpp's converter writes it (``gguf_architectures``),
served through ``LLM(file.gguf)`` with HF's greedy tokens on the same weights (fp32).

The files carry the embedded model's tokenizer cut to its first ``VOCAB`` tokens (a full
49k vocabulary takes gguf's reader seconds per read); prompts are token ids."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as GGML

from architecture_check import TINY_SIZES, write_tiny_checkpoint
from gguf_architectures import write_gguf
from octavo import LLM, SamplingParams
from octavo.model_executor.embedded import gguf_path
from octavo.model_executor.gguf_checkpoint import check_gguf_kinds, hf_name, iterate_gguf
from quantized_references import forced_torch_path

from conftest import hf_greedy

NEW_TOKENS = 8
VOCAB = 512
PROMPTS = [[1, 300, 17, 42], [1, *range(100, 130)], [7, 7, 7, 500, 3]]
CASES = {  # GGUF architecture -> (transformers model_type, config beyond TINY_SIZES)
    "qwen3": ("qwen3", {"tie_word_embeddings": False}),
    "gemma2": (
        "gemma2",
        {"attn_logit_softcapping": 4.0, "final_logit_softcapping": 8.0, "sliding_window": 8},
    ),
    "gemma3": ("gemma3_text", {"sliding_window": 8, "tie_word_embeddings": False}),
    "qwen3moe": (
        "qwen3_moe",
        {
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "norm_topk_prob": True,
        },
    ),
    "olmo2": ("olmo2", {"tie_word_embeddings": False}),
    "granite": (
        "granite",
        {
            "embedding_multiplier": 2.0,
            "residual_multiplier": 0.5,
            "attention_multiplier": 0.1,
            "logits_scaling": 4.0,
        },
    ),
    "smollm3": ("smollm3", {"tie_word_embeddings": False, "pad_token_id": 2}),  # default 128004
    "gpt-oss": (
        "gpt_oss",
        {  # swiglu_alpha / swiglu_limit stay gpt-oss's: llama.cpp fixes them, no metadata
            "max_position_embeddings": 256,
            "sliding_window": 8,
            "layer_types": ["sliding_attention", "full_attention"],
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 150000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
    ),
    "phi3": ("phi3", {"tie_word_embeddings": False, "pad_token_id": 2}),  # default: 32000
}
ENGINE = {"dtype": "float32", "kv_cache_memory": 2**24, "max_model_len": 128}


def run_octavo(path, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    with LLM(str(path), **ENGINE) as llm:
        inputs = [{"prompt_token_ids": ids} for ids in prompts]
        return [out.outputs[0].token_ids for out in llm.generate(inputs, params, use_tqdm=False)]


def hf_tokens(folder, prompts, state=None) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    if state is not None:
        model.load_state_dict(state, strict=False)
    return [hf_greedy(model, ids, NEW_TOKENS, ignore_eos=True) for ids in prompts]


@pytest.fixture(scope="module", params=sorted(CASES))
def converted(request, tmp_path_factory, smol_tokenizer):
    arch = request.param
    model_type, config = CASES[arch]
    root = tmp_path_factory.mktemp(f"gguf-{arch}")
    folder = write_tiny_checkpoint(
        root / "hf", model_type, smol_tokenizer, vocab_size=VOCAB, **config
    )
    path = root / f"tiny-{arch}.gguf"
    write_gguf(path, folder, arch, gguf_path())
    return arch, folder, path


def test_an_f32_gguf_is_token_identical_to_hf(converted):
    arch, folder, path = converted
    assert run_octavo(path, PROMPTS) == hf_tokens(folder, PROMPTS), arch


def test_mixtral_written_as_a_llama_with_experts_is_token_identical_to_hf(tmp_path, smol_tokenizer):
    """llama.cpp converts Mixtral as ``llama`` (Q/K permuted) with stacked experts."""
    config = {"vocab_size": VOCAB, "num_local_experts": 4, "num_experts_per_tok": 2}
    folder = write_tiny_checkpoint(tmp_path / "hf", "mixtral", smol_tokenizer, **config)
    path = tmp_path / "tiny-mixtral.gguf"
    write_gguf(path, folder, "llama", gguf_path())
    assert run_octavo(path, PROMPTS) == hf_tokens(folder, PROMPTS)


def test_a_q8_0_gguf_equals_hf_on_the_dequantized_weights(tmp_path, smol_tokenizer):
    """Matrices kept in their Q8_0 blocks (the torch path: no int8 activations) run as
    the float expansion of the file does in HF."""
    config = {"vocab_size": VOCAB, **CASES["gemma2"][1]}
    folder = write_tiny_checkpoint(tmp_path / "hf", "gemma2", smol_tokenizer, **config)
    path = tmp_path / "tiny-gemma2-q8_0.gguf"
    stored = write_gguf(path, folder, "gemma2", gguf_path(), GGML.Q8_0)
    with forced_torch_path():
        tokens = run_octavo(path, PROMPTS)
    assert tokens == hf_tokens(folder, PROMPTS, stored)


@pytest.mark.parametrize(
    ("arch", "gguf_name", "expected"),
    [
        ("gemma2", "blk.1.ffn_norm.weight", "model.layers.1.pre_feedforward_layernorm.weight"),
        ("llama", "blk.1.ffn_norm.weight", "model.layers.1.post_attention_layernorm.weight"),
        ("phi3", "blk.0.ffn_up.weight", "model.layers.0.mlp.gate_up_proj.weight"),
        ("phi3", "blk.0.attn_qkv.weight", "model.layers.0.self_attn.qkv_proj.weight"),
        ("olmo2", "blk.0.post_ffw_norm.weight", "model.layers.0.post_feedforward_layernorm.weight"),
        ("gpt-oss", "blk.2.attn_sinks", "model.layers.2.self_attn.sinks"),
        ("qwen3", "rope_freqs.weight", None),
    ],
)
def test_names_come_from_ggufs_table_per_architecture(arch, gguf_name, expected):
    assert hf_name(gguf_name, arch, TINY_SIZES["num_hidden_layers"] + 1) == expected


@pytest.mark.parametrize("arch", ["qwen2moe", "deepseek2"])
def test_moe_experts_octavo_cannot_read_yet_are_refused_by_name(tmp_path, arch):
    path = tmp_path / "moe.gguf"
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_tensor("blk.0.ffn_gate_exps.weight", np.zeros((4, 8, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match=f"experts of GGUF architecture '{arch}'"):
        check_gguf_kinds(path)


def test_gpt_oss_mxfp4_experts_come_back_in_the_checkpoint_layout(tmp_path):
    """The converter's split (gate, up ``[E, I, H]``; down ``[E, H, I]``) in MXFP4 blocks,
    read back as gpt-oss's ``gate_up_proj [E, H, 2I]`` (gate at even columns) and
    ``down_proj [E, I, H]``, equal to gguf's own dequantization."""
    rng = np.random.default_rng(3)
    parts = {"gate": (2, 96, 64), "up": (2, 96, 64), "down": (2, 64, 96)}
    path, expanded = tmp_path / "experts.gguf", {}
    writer = gguf.GGUFWriter(str(path), "gpt-oss")
    for part, shape in parts.items():
        blocks = gguf.quants.quantize(rng.standard_normal(shape).astype(np.float32), GGML.MXFP4)
        writer.add_tensor(f"blk.0.ffn_{part}_exps.weight", blocks, raw_dtype=GGML.MXFP4)
        expanded[part] = torch.from_numpy(gguf.quants.dequantize(blocks, GGML.MXFP4).copy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    got = dict(iterate_gguf(path, num_heads=4, num_kv_heads=2))
    gate_up = got["model.layers.0.mlp.experts.gate_up_proj"]
    assert torch.equal(gate_up[:, :, 0::2], expanded["gate"].transpose(1, 2))
    assert torch.equal(gate_up[:, :, 1::2], expanded["up"].transpose(1, 2))
    assert torch.equal(
        got["model.layers.0.mlp.experts.down_proj"], expanded["down"].transpose(1, 2)
    )
