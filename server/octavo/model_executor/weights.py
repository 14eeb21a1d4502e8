"""Reading Hugging Face safetensors checkpoints into Octavo's fused Llama-family layout."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from octavo.model_executor.llama import LlamaForCausalLM

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_FUSED = {  # HF name inside a layer -> (our parameter, which slot of the fused matrix)
    "self_attn.q_proj": ("qkv", 0),
    "self_attn.k_proj": ("qkv", 1),
    "self_attn.v_proj": ("qkv", 2),
    "mlp.gate_proj": ("gate_up", 0),
    "mlp.up_proj": ("gate_up", 1),
}
_PLAIN = {
    "self_attn.o_proj.weight": "o_proj.weight",
    "mlp.down_proj.weight": "down_proj.weight",
    "input_layernorm.weight": "input_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
}


def iterate_checkpoint(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors weights in {folder}")
    for file in files:
        with safe_open(str(file), framework="pt") as reader:
            for name in reader.keys():  # noqa: SIM118 (safe_open is not a mapping)
                yield name, reader.get_tensor(name)


def load_weights(model: LlamaForCausalLM, folder: Path) -> None:
    """Copy every checkpoint tensor into the model; fail loudly on anything left unset."""
    loaded: set[str] = set()
    for name, tensor in iterate_checkpoint(folder):
        target = _copy_into(model, name, tensor)
        if target:
            loaded.add(target)
    missing = _expected_names(model) - loaded
    if missing:
        raise ValueError(f"checkpoint in {folder} lacks weights: {sorted(missing)[:5]}")


def _copy_into(model: LlamaForCausalLM, name: str, tensor: torch.Tensor) -> str | None:
    if name == "model.embed_tokens.weight":
        return _assign(model.embed_tokens.weight, tensor, "embed_tokens.weight")
    if name == "model.norm.weight":
        return _assign(model.final_norm.weight, tensor, "final_norm.weight")
    if name == "lm_head.weight":
        if model.config.tie_word_embeddings:
            return None
        return _assign(model.lm_head.weight, tensor, "lm_head.weight")
    match = _LAYER.match(name)
    if match is None:
        return None  # e.g. rotary inv_freq buffers in old checkpoints
    layer = model.layers[int(match.group(1))]
    return _copy_into_layer(layer, int(match.group(1)), match.group(2), tensor)


def _copy_into_layer(layer, index: int, name: str, tensor: torch.Tensor) -> str | None:
    prefix = f"layers.{index}."
    if name in _PLAIN:
        target = _PLAIN[name]
        parameter = layer.get_parameter(target)
        return _assign(parameter, tensor, prefix + target)
    module_name, _, kind = name.rpartition(".")
    if module_name not in _FUSED:
        return None
    fused, slot = _FUSED[module_name]
    parameter = getattr(layer, fused).get_parameter(kind)
    start, end = _slot_range(layer, fused, slot)
    _assign(parameter[start:end], tensor, f"{prefix}{module_name}.{kind}")
    return f"{prefix}{fused}.{kind}.{slot}"


def _slot_range(layer, fused: str, slot: int) -> tuple[int, int]:
    sizes = layer.split_sizes if fused == "qkv" else [layer.gate_up.out_features // 2] * 2
    start = sum(sizes[:slot])
    return start, start + sizes[slot]


def _assign(parameter: torch.Tensor, tensor: torch.Tensor, name: str) -> str:
    if parameter.shape != tensor.shape:
        raise ValueError(
            f"{name}: checkpoint shape {tuple(tensor.shape)} != {tuple(parameter.shape)}"
        )
    parameter.copy_(tensor)
    return name


def _expected_names(model: LlamaForCausalLM) -> set[str]:
    names = {"embed_tokens.weight", "final_norm.weight"}
    if not model.config.tie_word_embeddings:
        names.add("lm_head.weight")
    for index, layer in enumerate(model.layers):
        prefix = f"layers.{index}."
        names.update(prefix + target for target in _PLAIN.values())
        kinds = ["weight", "bias"] if layer.qkv.bias is not None else ["weight"]
        names.update(f"{prefix}qkv.{kind}.{slot}" for kind in kinds for slot in range(3))
        names.update(f"{prefix}gate_up.weight.{slot}" for slot in range(2))
    return names
