"""The parts of a Hugging Face ``config.json`` every architecture needs, and the whole of it.

The common fields (sizes, heads, rope, windows) are read here; what only one architecture
uses (Gemma's soft-caps, Granite's multipliers, MoE sizes) its model file reads from
``hf``: transformers' own config object for the folder, so defaults and old spellings are
transformers' (vLLM reads configs the same way).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from octavo.model_executor.context_length import ContextLength, context_length_of
from octavo.model_executor.hf_overrides import apply_hf_overrides
from octavo.model_executor.models.registry import check_architecture
from octavo.model_executor.rope_parameters import rope_parameters_for

FULL_ATTENTION, SLIDING_ATTENTION = "full_attention", "sliding_attention"


@dataclass
class ModelConfig:
    architecture: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    rope: dict = field(default_factory=dict)  # rope_type, rope_theta and scaling parameters
    sliding_window: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    layer_types: tuple[str, ...] = ()  # FULL_ATTENTION or SLIDING_ATTENTION per layer
    # not from config.json: the engine's --enable-expert-parallel (MoE experts placed whole
    # per tensor rank instead of each split over every rank)
    enable_expert_parallel: bool = False
    # not from config.json: the engine's --runner pooling (no LM head is built)
    pooling_only: bool = False
    hf: Any = field(default=None, repr=False, compare=False)  # transformers' config object
    # the longest max_model_len the config allows (rope scaling included) and its default
    context: ContextLength | None = None
    # the whole config.json (a multimodal checkpoint's vision_config and projector settings)
    checkpoint: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, raw: dict) -> ModelConfig:
        """Every field from transformers' config object of the (text) config; what it does
        not carry comes from ``_from_config_json``."""
        architecture = check_architecture((raw.get("architectures") or ["?"])[0])
        text = _text_config(raw)
        hf = transformers_config(text)
        heads = hf.num_attention_heads
        config = cls(
            architecture=architecture,
            hidden_size=hf.hidden_size,
            intermediate_size=hf.intermediate_size,
            num_layers=hf.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(hf, "num_key_value_heads", None) or heads,
            head_dim=getattr(hf, "head_dim", None) or hf.hidden_size // heads,
            vocab_size=hf.vocab_size,
            rms_norm_eps=getattr(hf, "rms_norm_eps", None) or 1e-6,
            max_position_embeddings=getattr(hf, "max_position_embeddings", None) or 2048,
            tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
            attention_bias=bool(getattr(hf, "attention_bias", False)),
            sliding_window=_sliding_window(hf),
            hf=hf,
            checkpoint=raw,
        )
        config.rope = rope_parameters_for(hf.to_dict())
        config.context, config.eos_token_ids = _from_config_json(text, config.rope)
        config.layer_types = _layer_types(hf, config)
        return config

    @property
    def uniform_sliding_window(self) -> int | None:
        """The window when every layer slides (KV blocks behind it can be freed)."""
        if self.sliding_window and all(t == SLIDING_ATTENTION for t in self.layer_types):
            return self.sliding_window
        return None

    @property
    def kv_latent_dim(self) -> int | None:
        """Multi-head latent attention (DeepSeek-V2/V3, Kimi K2): the values one token caches
        per layer, its compressed latent and roped key (``kv_lora_rank + qk_rope_head_dim``);
        None for keys and values."""
        rank = getattr(self.hf, "kv_lora_rank", None)
        rope_dim = getattr(self.hf, "qk_rope_head_dim", None)
        return None if rank is None or rope_dim is None else rank + rope_dim

    def window_of(self, layer: int) -> int | None:
        """The sliding window of ``layer`` (``None``: full attention)."""
        return self.sliding_window if self.layer_types[layer] == SLIDING_ATTENTION else None

    @classmethod
    def from_folder(cls, folder: Path, hf_overrides: dict | None = None) -> ModelConfig:
        """``hf_overrides`` (``--hf-overrides``) are merged into config.json first."""
        raw = json.loads((folder / "config.json").read_text())
        config = cls.from_dict(apply_hf_overrides(raw, hf_overrides))
        generation = folder / "generation_config.json"
        if generation.exists():
            extra = _as_tuple(json.loads(generation.read_text()).get("eos_token_id"))
            config.eos_token_ids = tuple(dict.fromkeys(config.eos_token_ids + extra))
        return config


# The generation_config.json keys vLLM's ``get_diff_sampling_param`` takes as defaults.
GENERATION_DEFAULT_KEYS = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p")


def generation_defaults(folder: Path) -> dict:
    """Sampling defaults from ``folder``'s generation_config.json, as vLLM reads them:
    only values that differ from transformers' own defaults (``to_diff_dict``), and
    ``max_new_tokens`` as ``max_tokens``. ``{}`` when the folder has none."""
    if not (folder / "generation_config.json").is_file():
        return {}
    from transformers import GenerationConfig

    try:
        diff = GenerationConfig.from_pretrained(folder).to_diff_dict()
    except (OSError, ValueError) as error:
        raise ValueError(f"{folder / 'generation_config.json'}: {error}") from None
    defaults = {key: diff[key] for key in GENERATION_DEFAULT_KEYS if diff.get(key) is not None}
    if diff.get("max_new_tokens") is not None:
        defaults["max_tokens"] = diff["max_new_tokens"]
    return defaults


def transformers_config(raw: dict):
    """transformers' config object for ``raw`` (its defaults filled in); a plain
    ``PretrainedConfig`` for a ``model_type`` transformers does not know."""
    from transformers import AutoConfig, PretrainedConfig

    fields = {key: value for key, value in raw.items() if key != "model_type"}
    # transformers 5 writes inf/nan as {"__float__": "Infinity"} (Granite 4.0's
    # time_step_limit): decoded as its from_pretrained decodes them
    fields = PretrainedConfig._decode_special_floats(fields)
    try:
        return AutoConfig.for_model(raw.get("model_type", ""), **fields)
    except ValueError:
        return PretrainedConfig(**fields)


def _text_config(raw: dict) -> dict:
    """A multimodal checkpoint's text tower (``text_config``, e.g. Gemma 3's), with the
    outer config's token ids."""
    text = raw.get("text_config")
    if not text:
        return raw
    # transformers 4 wrote only the tower's non-default values (google/gemma-3-4b-it's
    # text_config has no num_attention_heads): transformers' defaults fill in the rest.
    full = transformers_config(text).to_dict()
    outer = ("eos_token_id", "bos_token_id", "tie_word_embeddings")
    inherited = {key: raw[key] for key in outer if key in raw}
    return {**full, **inherited, "architectures": raw["architectures"]}


def _layer_types(hf, config: ModelConfig) -> tuple[str, ...]:
    """transformers' ``layer_types`` where the config has them, else every layer slides
    when the config names a window (Mistral, Phi-3) and attends fully when not."""
    types = getattr(hf, "layer_types", None)
    if types:
        return tuple(types[: config.num_layers])
    default = SLIDING_ATTENTION if config.sliding_window else FULL_ATTENTION
    return (default,) * config.num_layers


def _from_config_json(text: dict, rope: dict) -> tuple[ContextLength, tuple[int, ...]]:
    """The fallbacks read from the config.json fields themselves, not transformers' object:
    the context length (only the lengths the file names, where transformers' defaults
    would invent one) and the end-of-sequence ids (none unless the file names them)."""
    return context_length_of(text, rope), _as_tuple(text.get("eos_token_id"))


def _sliding_window(hf) -> int | None:
    """The window, unless ``use_sliding_window`` (Qwen 2/3, SmolLM3) turns it off."""
    if getattr(hf, "use_sliding_window", True) is False:
        return None
    return getattr(hf, "sliding_window", None) or None


def _as_tuple(value: int | list[int] | None) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list) else (value,)
