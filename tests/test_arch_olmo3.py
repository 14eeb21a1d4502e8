"""OLMo 3 (``Olmo3ForCausalLM``): a tiny random checkpoint written by transformers, greedy
fp32 token-identical to HF ``generate`` with chunked prefill, forced preemption and a
prefix-cache hit (``architecture_check``).

The checkpoint sets what OLMo 3 adds to OLMo 2 to values that matter at this size: a
sliding layer then a full one (``layer_types``), a window of 24 tokens (shorter than the
long prompts, so keys leave it), and rope per layer type: YaRN on the full layer (as
OLMo 3's ``rope_scaling``), a different base on the sliding one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from architecture_check import assert_matches_hf, write_tiny_checkpoint
from octavo.model_executor.model_config import ModelConfig
from octavo.model_executor.models.registry import model_class

YARN = {
    "rope_type": "yarn",
    "rope_theta": 500000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 64,
    "beta_fast": 32,
    "beta_slow": 1,
}
OLMO3 = {
    "sliding_window": 24,
    "layer_types": ["sliding_attention", "full_attention"],
    "rope_parameters": {
        "full_attention": YARN,
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    },
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory, smol_tokenizer) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("olmo3"), "olmo3", smol_tokenizer, **OLMO3)


def test_greedy_matches_hf(folder, smol_tokenizer):
    assert_matches_hf(folder, smol_tokenizer)


def test_layers_follow_layer_types(folder):
    """The sliding layer has the window and the local rope; the full one YaRN, no window."""
    config = ModelConfig.from_folder(folder)
    model = model_class(config.architecture)(config)
    specs = [layer.spec.attention for layer in model.layers]
    assert [(spec.sliding_window, spec.rope) for spec in specs] == [
        (24, "sliding_attention"),
        (None, "full_attention"),
    ]
    ropes = model.rope_parameters()
    assert ropes["full_attention"]["rope_type"] == "yarn"
    assert ropes["sliding_attention"]["rope_theta"] == 10000.0
