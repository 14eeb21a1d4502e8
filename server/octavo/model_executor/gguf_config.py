"""A GGUF file's Hugging Face config for the architectures transformers' GGUF reader does
not describe (OLMo2, Granite, SmolLM3, Mixtral, which llama.cpp writes as a ``llama``
with experts, and gpt-oss, whose rope-scaling values transformers' reader leaves as numpy
views a config cannot save): the hyperparameters llama.cpp's converter writes
(``{arch}.block_count``, ...) under transformers' config names. The model class's
``gguf_layout`` names the model type and its keys beyond ``COMMON_KEYS``."""

from __future__ import annotations

from pathlib import Path

from octavo.model_executor.gguf_layout import GgufLayout, file_layout

COMMON_KEYS = {  # "{arch}.key" -> config attribute, as every converter writes them
    "context_length": "max_position_embeddings",
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "embedding_length": "hidden_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "attention.key_length": "head_dim",
    "rope.freq_base": "rope_theta",
    "vocab_size": "vocab_size",
}
YARN_KEYS = {
    "rope.scaling.factor": "factor",
    "rope.scaling.original_context_length": "original_max_position_embeddings",
}
TOKEN_IDS = {"bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id"}


def read_metadata(path: Path) -> tuple[dict, tuple[str, ...]]:
    """The file's metadata (arrays as their lengths) and tensor names, read fast."""
    from transformers.integrations.gguf.reader import read_gguf_metadata

    return read_gguf_metadata(str(path))


def model_type(metadata: dict) -> str | None:
    """The HF model type Octavo describes the file as (None: transformers does)."""
    return _layout(metadata).model_type


def _layout(metadata: dict) -> GgufLayout:
    """The layout the file's model class declares (Mixtral: a ``llama`` with experts)."""
    arch = metadata.get("general.architecture")
    return file_layout(arch, with_experts=bool(metadata.get(f"{arch}.expert_count")))[1]


def plain(value):
    """A metadata value as a Python scalar (the reader may hand over numpy views)."""
    return value.item() if hasattr(value, "item") and getattr(value, "ndim", 1) == 0 else value


def described_by_octavo(metadata: dict) -> bool:
    return model_type(metadata) is not None


def config_from_metadata(metadata: dict, tensor_names: tuple[str, ...]):
    """The transformers config of a file whose model class names its model type."""
    from transformers import AutoConfig

    arch, layout = metadata["general.architecture"], _layout(metadata)
    kind, keys = layout.model_type, {**COMMON_KEYS, **layout.config_keys}
    values = {
        attr: plain(metadata[f"{arch}.{key}"])
        for key, attr in keys.items()
        if f"{arch}.{key}" in metadata
    }
    values.setdefault("vocab_size", metadata.get("tokenizer.ggml.tokens"))
    for attr, key in TOKEN_IDS.items():
        if f"tokenizer.ggml.{key}" in metadata:
            values[attr] = plain(metadata[f"tokenizer.ggml.{key}"])
    values["tie_word_embeddings"] = "output.weight" not in tensor_names
    if plain(metadata.get(f"{arch}.rope.scaling.type")) == "yarn":
        rope = {"rope_type": "yarn", "rope_theta": values.pop("rope_theta", 10000.0)}
        for key, name in YARN_KEYS.items():
            if f"{arch}.{key}" in metadata:
                rope[name] = plain(metadata[f"{arch}.{key}"])
        values["rope_parameters"] = rope
    return AutoConfig.for_model(kind, architectures=None, **values)
