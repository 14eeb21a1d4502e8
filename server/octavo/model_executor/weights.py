"""Reading Hugging Face safetensors checkpoints into Octavo's fused Llama-family layout.

Each tensor is handed over as a ``CheckpointSlice``: the layer's weight loader reads only
this rank's part of it. Under pipeline parallelism a stage skips the layers it lacks.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from octavo.model_executor.checkpoint_slice import CheckpointSlice, materialize
from octavo.model_executor.llama import LlamaForCausalLM

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_FUSED = {  # HF name inside a layer -> (our layer, its shard id, slot name in the bookkeeping)
    "self_attn.q_proj": ("qkv", "q", 0),
    "self_attn.k_proj": ("qkv", "k", 1),
    "self_attn.v_proj": ("qkv", "v", 2),
    "mlp.gate_proj": ("gate_up", 0, 0),
    "mlp.up_proj": ("gate_up", 1, 1),
}
_SHARDED = {  # HF name inside a layer -> our parameter (its layer's weight_loader slices it)
    "self_attn.o_proj.weight": "o_proj.weight",
    "mlp.down_proj.weight": "down_proj.weight",
}
_REPLICATED = {
    "input_layernorm.weight": "input_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
}
_PLAIN = {**_SHARDED, **_REPLICATED}


def iterate_checkpoint(folder: Path) -> Iterator[tuple[str, CheckpointSlice]]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors weights in {folder}")
    for file in files:
        with safe_open(str(file), framework="pt") as reader:
            for name in reader.keys():  # noqa: SIM118 (safe_open is not a mapping)
                yield name, CheckpointSlice(reader.get_slice(name))


def load_weights(
    model: LlamaForCausalLM, folder: Path, tensors: Iterable[tuple[str, object]] | None = None
) -> None:
    """Copy every checkpoint tensor (the folder's safetensors unless ``tensors`` are given,
    e.g. a GGUF file's) into the model; fail loudly on anything left unset."""
    loaded: set[str] = set()
    for name, tensor in iterate_checkpoint(folder) if tensors is None else tensors:
        loaded.update(_copy_into(model, name, tensor))
    missing = _expected_names(model) - loaded
    if missing:
        raise ValueError(f"checkpoint in {folder} lacks weights: {sorted(missing)[:5]}")


def _copy_into(model: LlamaForCausalLM, name: str, tensor: CheckpointSlice) -> list[str]:
    """The names (in ``_expected_names``' terms) this checkpoint tensor filled."""
    tied = model.config.tie_word_embeddings
    if name == "model.embed_tokens.weight":
        return _copy_embedding(model, tensor, name)
    if name == "model.norm.weight":
        if model.final_norm is None:
            return []
        return [_assign(model.final_norm.weight, tensor, "final_norm.weight")]
    if name == "lm_head.weight":
        if tied or model.lm_head is None:
            return []
        model.lm_head.weight_loader(model.lm_head.weight, tensor, name)
        return ["lm_head.weight"]
    match = _LAYER.match(name)
    if match is None:
        return []  # e.g. rotary inv_freq buffers in old checkpoints
    index = int(match.group(1)) - model.first_layer
    if not 0 <= index < len(model.layers):
        return []  # another pipeline stage's layer
    target = _copy_into_layer(model.layers[index], int(match.group(1)), match.group(2), tensor)
    return [target] if target else []


def _copy_embedding(model: LlamaForCausalLM, tensor: CheckpointSlice, name: str) -> list[str]:
    """The embedding, and a tied LM head that does not share its storage (one in a last
    stage without the embedding, or a quantized one)."""
    filled = []
    if model.embed_tokens is not None:
        model.embed_tokens.weight_loader(model.embed_tokens.weight, tensor, name)
        filled.append("embed_tokens.weight")
    if model.config.tie_word_embeddings and _lm_head_separate(model):
        model.lm_head.weight_loader(model.lm_head.weight, tensor, name)
        filled.append("lm_head.weight")
    return filled


def _lm_head_separate(model: LlamaForCausalLM) -> bool:
    """The last stage's LM head has storage of its own (not the embedding's)."""
    if model.lm_head is None:
        return False
    return model.embed_tokens is None or model.lm_head.weight is not model.embed_tokens.weight


def _copy_into_layer(layer, index: int, name: str, tensor: CheckpointSlice) -> str | None:
    prefix = f"layers.{index}."
    if name in _REPLICATED:
        target = _REPLICATED[name]
        return _assign(layer.get_parameter(target), tensor, prefix + target)
    if name in _SHARDED:
        target = _SHARDED[name]
        module_name, _, kind = target.partition(".")
        module = getattr(layer, module_name)
        module.weight_loader(getattr(module, kind), tensor, prefix + target)
        return prefix + target
    module_name, _, kind = name.rpartition(".")
    if module_name not in _FUSED:
        return None
    fused, shard_id, slot = _FUSED[module_name]
    module = getattr(layer, fused)
    module.weight_loader(getattr(module, kind), tensor, f"{prefix}{name}", shard_id)
    return f"{prefix}{fused}.{kind}.{slot}"


def _assign(parameter: torch.Tensor, tensor: CheckpointSlice, name: str) -> str:
    if parameter.shape != tensor.shape:
        raise ValueError(
            f"{name}: checkpoint shape {tuple(tensor.shape)} != {tuple(parameter.shape)}"
        )
    parameter.copy_(materialize(tensor))
    return name


def _expected_names(model: LlamaForCausalLM) -> set[str]:
    names = set()
    if model.embed_tokens is not None:
        names.add("embed_tokens.weight")
    if model.lm_head is not None:
        names.add("final_norm.weight")
        if _lm_head_separate(model):
            names.add("lm_head.weight")
    for index, layer in enumerate(model.layers, start=model.first_layer):
        prefix = f"layers.{index}."
        names.update(prefix + target for target in _PLAIN.values())
        kinds = ["weight", "bias"] if layer.qkv.bias is not None else ["weight"]
        names.update(f"{prefix}qkv.{kind}.{slot}" for kind in kinds for slot in range(3))
        names.update(f"{prefix}gate_up.weight.{slot}" for slot in range(2))
    return names
