"""Tiny random-weight Llama-family models for tests, built from configs (no downloads)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

TINY_CONFIGS = {
    # Qwen2: q/k/v biases, GQA 4:2, untied embeddings.
    "qwen2": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
    },
    # Llama-3 style: llama3 RoPE scaling, GQA 4:1, tied embeddings.
    "llama3": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 160,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
    },
}


def build_tiny_model(folder: Path, name: str, tokenizer, **overrides) -> Path:
    """A random-weight model folder (config.json, safetensors, tokenizer) of TINY_CONFIGS[name],
    with config ``overrides``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    raw = {**TINY_CONFIGS[name], "vocab_size": len(tokenizer), **overrides}
    raw["bos_token_id"], raw["eos_token_id"] = tokenizer.bos_token_id, tokenizer.eos_token_id
    config = AutoConfig.for_model(raw.pop("model_type"), **raw)
    torch.manual_seed(1234)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for parameter in model.parameters():  # larger weights: sharper, tie-free argmaxes
            parameter.normal_(0.0, 0.2)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    saved = json.loads((folder / "config.json").read_text())
    assert saved["architectures"] == raw["architectures"]
    return folder
