"""A random-weight model of a real model's shape with other head counts, for benchmarks.

SmolLM2-135M has 9 attention heads: it splits over 1 or 3 tensor-parallel ranks, not 2.
To compare 1 and 2 ranks on the same hardware the parallel benchmark builds a model of
SmolLM2's size (30 layers, hidden 576 → 512, 8 heads of 64, 4 KV heads) with random
weights: throughput does not depend on what the weights say (``ignore_eos`` fixes the
token counts).
"""

from __future__ import annotations

from pathlib import Path

import torch

EVEN_HEADS = {"hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 4}


def build_even_head_model(source: Path, target: Path) -> Path:
    """``target``: ``source``'s config with ``EVEN_HEADS``, random weights, its tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if (target / "config.json").is_file():
        return target
    config = AutoConfig.from_pretrained(source)
    for key, value in EVEN_HEADS.items():
        setattr(config, key, value)
    config.head_dim = EVEN_HEADS["hidden_size"] // EVEN_HEADS["num_attention_heads"]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(source).save_pretrained(target)
    return target
