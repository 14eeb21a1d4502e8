"""``ModelConfig`` reads one source, transformers' config object: a layer's window as its
attention sees it and as the KV block freeing sees it are the same value.

SmolLM3 once disagreed: its layers read ``use_sliding_window`` from transformers' object,
the block freeing read ``sliding_window`` from the raw config.json, so a file that names a
window but leaves ``use_sliding_window`` out (transformers: off) freed blocks its layers
still attended to.
"""

from __future__ import annotations

import pytest

from octavo.model_executor.model_config import SLIDING_ATTENTION, ModelConfig
from octavo.model_executor.models.registry import model_class

WINDOW = 8
SMOLLM3 = {
    "architectures": ["SmolLM3ForCausalLM"],
    "model_type": "smollm3",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
    "sliding_window": WINDOW,
    "no_rope_layers": [1, 0],
    "pad_token_id": None,
}
ALL_SLIDING = {"layer_types": [SLIDING_ATTENTION] * 2}


def hf_window(config: ModelConfig, index: int) -> int | None:
    """transformers' SmolLM3Attention's window for layer ``index``."""
    hf = config.hf
    slides = hf.use_sliding_window and hf.layer_types[index] == SLIDING_ATTENTION
    return hf.sliding_window if slides else None


@pytest.mark.parametrize("use_sliding_window", [None, False, True])
@pytest.mark.parametrize("layer_types", [{}, ALL_SLIDING])
def test_smollm3_layer_windows_and_block_freeing_agree(use_sliding_window, layer_types):
    raw = {**SMOLLM3, **layer_types}
    if use_sliding_window is not None:
        raw["use_sliding_window"] = use_sliding_window
    config = ModelConfig.from_dict(raw)
    model = model_class(config.architecture)(config)
    windows = [model.attention_spec(i).sliding_window for i in range(config.num_layers)]
    assert windows == [config.window_of(i) for i in range(config.num_layers)]
    assert windows == [hf_window(config, i) for i in range(config.num_layers)]
    every_layer_slides = all(window == WINDOW for window in windows)
    assert config.uniform_sliding_window == (WINDOW if every_layer_slides else None)
    assert every_layer_slides == (use_sliding_window is True and bool(layer_types))


def test_fields_transformers_fills_in_are_its_defaults():
    """A config.json that leaves fields out gets transformers' defaults (what HF's model
    runs with), not a second set of Octavo's own."""
    minimal = {key: SMOLLM3[key] for key in ("architectures", "model_type", "vocab_size")}
    config = ModelConfig.from_dict({**minimal, "hidden_size": 64, "num_attention_heads": 4})
    hf = config.hf
    assert (config.num_kv_heads, config.max_position_embeddings) == (
        hf.num_key_value_heads,
        hf.max_position_embeddings,
    )
    assert config.rope["rope_theta"] == hf.rope_parameters["rope_theta"]
