"""Tiny random-weight decoder embedding models in sentence-transformers' layout, built in
the test (no downloads): the decoder saved without its LM head (as Qwen3-Embedding is),
``modules.json`` with Transformer → Pooling (→ Normalize)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

QWEN3_EMBEDDING = {
    "architectures": ["Qwen3ForCausalLM"],  # as Qwen3-Embedding's config.json says
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
}
POOLING_FLAGS = {
    "LAST": "pooling_mode_lasttoken",
    "MEAN": "pooling_mode_mean_tokens",
    "CLS": "pooling_mode_cls_token",
}


def build_embedding_model(
    folder: Path, tokenizer, pooling: str = "LAST", normalize: bool = True, **overrides
) -> Path:
    """A sentence-transformers folder around a random Qwen3 decoder (``overrides`` go into
    config.json, e.g. ``architectures=["Qwen3Model"]`` or ``is_matryoshka=True``)."""
    from transformers import AutoConfig, AutoModel

    raw = {**QWEN3_EMBEDDING, "vocab_size": len(tokenizer)}
    raw["bos_token_id"], raw["eos_token_id"] = tokenizer.bos_token_id, tokenizer.eos_token_id
    config = AutoConfig.for_model(raw.pop("model_type"), **raw)
    torch.manual_seed(4321)
    model = AutoModel.from_config(config, dtype=torch.float32)  # Qwen3Model: no LM head
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.2)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    saved = json.loads((folder / "config.json").read_text())
    saved.update({"architectures": QWEN3_EMBEDDING["architectures"], **overrides})
    (folder / "config.json").write_text(json.dumps(saved, indent=2))
    _write_sentence_transformers_files(folder, pooling, normalize, raw["hidden_size"])
    return folder


def _write_sentence_transformers_files(
    folder: Path, pooling: str, normalize: bool, hidden_size: int
) -> None:
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    if normalize:
        modules.append(
            {
                "idx": 2,
                "name": "2",
                "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize",
            }
        )
        (folder / "2_Normalize").mkdir()
    (folder / "modules.json").write_text(json.dumps(modules, indent=2))
    (folder / "1_Pooling").mkdir()
    flags = {flag: name == pooling for name, flag in POOLING_FLAGS.items()}
    settings = {"word_embedding_dimension": hidden_size, **flags, "include_prompt": True}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(settings, indent=2))
    (folder / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": 512, "do_lower_case": False})
    )
