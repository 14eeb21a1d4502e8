"""A model's rope settings, read from any config spelling (torch-free: the server's API
process reads a config without the engine; the cos/sin tables are ``rotary.py``'s)."""

from __future__ import annotations

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
ROPE_TYPES = ("default", "linear", "llama3", "yarn", "dynamic", "longrope")
_ROPE_TYPE_ALIASES = {"su": "longrope"}  # early Phi-3 checkpoints
_PRETRAINED_LENGTH_TYPES = ("llama3", "yarn", "longrope")  # need original_max_position_embeddings


def rope_parameters_for(raw_config: dict, layer_type: str = FULL_ATTENTION) -> dict:
    """The rope settings of ``layer_type``'s layers, merged from any config spelling.

    Reads transformers 5's ``rope_parameters`` (flat, or per layer type as Gemma 3 writes
    it), transformers 4's ``rope_theta`` + ``rope_scaling`` (``type`` or ``rope_type``), and
    Gemma 3's older ``rope_local_base_freq`` for sliding layers. The result always has
    ``rope_type`` and ``rope_theta``; top-level ``partial_rotary_factor``,
    ``original_max_position_embeddings`` and ``max_position_embeddings`` are carried in
    when the rope settings do not name them.
    """
    declared = raw_config.get("rope_parameters") or {}
    if _is_per_layer_type(declared):
        if layer_type not in declared:
            raise ValueError(
                f"rope_parameters has no entry for layer type {layer_type!r} "
                f"(it has {', '.join(sorted(declared))})"
            )
        rope = dict(declared[layer_type])
    elif layer_type == SLIDING_ATTENTION and "rope_local_base_freq" in raw_config:
        rope = {"rope_type": "default", "rope_theta": raw_config["rope_local_base_freq"]}
    else:
        rope = dict(declared)
        rope.update(raw_config.get("rope_scaling") or {})
    rope.setdefault("rope_theta", raw_config.get("rope_theta", 10000.0))
    for key in ("partial_rotary_factor", "original_max_position_embeddings"):
        if key in raw_config and raw_config[key] is not None:
            rope.setdefault(key, raw_config[key])
    if raw_config.get("max_position_embeddings"):
        rope.setdefault("max_position_embeddings", raw_config["max_position_embeddings"])
    rope_type = rope.pop("type", None)
    rope_type = rope.get("rope_type") or rope_type or "default"
    rope["rope_type"] = _ROPE_TYPE_ALIASES.get(rope_type, rope_type)
    if rope["rope_type"] in _PRETRAINED_LENGTH_TYPES and rope.get("max_position_embeddings"):
        # transformers 5's default where a config leaves the pretraining length out
        rope.setdefault("original_max_position_embeddings", rope["max_position_embeddings"])
    return rope


def _is_per_layer_type(declared: dict) -> bool:
    return bool(declared) and all(isinstance(value, dict) for value in declared.values())
