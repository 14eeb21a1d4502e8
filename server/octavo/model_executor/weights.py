"""Reading Hugging Face safetensors checkpoints into a ``CausalLM``'s fused layout.

Checkpoint names are first put in Llama's naming by the architecture
(``CausalLM.checkpoint_name``); the modules then carry HF's names, except the fused
linears: ``q/k/v_proj`` fill ``self_attn.qkv`` and ``gate/up_proj`` fill ``mlp.gate_up``
(what the model class's ``stored_fused_modules`` says its checkpoint stores fused, as
Phi-3's, is split first). A block that loads its own tensors (a ``FusedMoE``) is handed
the rest of the name. Each tensor is handed over as a ``CheckpointSlice``: the weight
loaders read only this rank's part of it. Under pipeline parallelism a stage skips the
layers it lacks.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from octavo.model_executor.checkpoint_slice import CheckpointSlice, RowRange, materialize
from octavo.model_executor.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from octavo.model_executor.models.causal_lm import CausalLM
from octavo.progress import PhaseReporter

_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_FUSED = {  # HF module inside a layer -> (our fused linear, its shard id)
    "self_attn.q_proj": ("self_attn.qkv", "q"),
    "self_attn.k_proj": ("self_attn.qkv", "k"),
    "self_attn.v_proj": ("self_attn.qkv", "v"),
    "mlp.gate_proj": ("mlp.gate_up", 0),
    "mlp.up_proj": ("mlp.gate_up", 1),
}


def iterate_checkpoint(folder: Path) -> Iterator[tuple[str, CheckpointSlice]]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors weights in {folder}")
    for file in files:
        with safe_open(str(file), framework="pt") as reader:
            for name in reader.keys():  # noqa: SIM118 (safe_open is not a mapping)
                yield name, CheckpointSlice(reader.get_slice(name))


def count_checkpoint_tensors(folder: Path) -> int:
    """How many tensors the folder's safetensors hold (read from their headers alone)."""
    count = 0
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as reader:
            count += len(reader.keys())
    return count


def load_weights(
    model: CausalLM, folder: Path, tensors: Iterable[tuple[str, object]] | None = None
) -> None:
    """Copy every checkpoint tensor (the folder's safetensors unless ``tensors`` are given,
    e.g. a GGUF file's) into the model; fail loudly on anything left unset."""
    loaded: set[str] = set()
    total = count_checkpoint_tensors(folder) if tensors is None else None
    with PhaseReporter("loading weights", total, "tensors") as progress:
        for name, tensor in iterate_checkpoint(folder) if tensors is None else tensors:
            loaded.update(_copy_into(model, name, tensor))
            progress.update()
    missing = expected_keys(model) - loaded
    if missing:
        raise ValueError(f"checkpoint in {folder} lacks weights: {sorted(missing)[:5]}")


def _copy_into(model: CausalLM, name: str, tensor) -> list[str]:
    """The keys (in ``expected_keys``' terms) this checkpoint tensor filled."""
    name = model.checkpoint_name(name)
    if name is None:
        return []
    name = name.removeprefix("model.")
    if name == "embed_tokens.weight":
        return _copy_embedding(model, tensor, name)
    if name == "lm_head.weight":
        if model.config.tie_word_embeddings or model.lm_head is None:
            return []
        model.lm_head.weight_loader(model.lm_head.weight, tensor, name)
        return [name]
    match = _LAYER.match(name)
    if match is None:
        return _copy_plain(model, name, tensor)  # the final norm (e.g. rotary buffers: none)
    index = int(match.group(1)) - model.first_layer
    if not 0 <= index < len(model.layers):
        return []  # another pipeline stage's layer
    prefix = f"layers.{match.group(1)}."
    stored_fused = model.stored_fused_modules
    keys = _copy_into_layer(model.layers[index], match.group(2), tensor, stored_fused)
    return [prefix + key for key in keys]


def _copy_embedding(model: CausalLM, tensor, name: str) -> list[str]:
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


def _lm_head_separate(model: CausalLM) -> bool:
    """The last stage's LM head has storage of its own (not the embedding's)."""
    if model.lm_head is None:
        return False
    return model.embed_tokens is None or model.lm_head.weight is not model.embed_tokens.weight


def _copy_into_layer(
    layer: nn.Module, name: str, tensor, stored_fused: dict[str, str]
) -> list[str]:
    module_name, _, kind = name.rpartition(".")
    if module_name in _FUSED:
        fused, shard_id = _FUSED[module_name]
        module = layer.get_submodule(fused)
        module.weight_loader(getattr(module, kind), tensor, name, shard_id)
        return [f"{fused}.{kind}.{shard_id}"]
    if module_name in stored_fused:
        target = stored_fused[module_name]
        return _copy_stored_fused(layer.get_submodule(target), target, kind, tensor)
    owner_name, _, rest = name.partition(".")
    owner = getattr(layer, owner_name, None)
    if hasattr(owner, "load_checkpoint_tensor"):  # a block that loads its own (MoE)
        return [f"{owner_name}.{key}" for key in owner.load_checkpoint_tensor(rest, tensor)]
    return _copy_plain(layer, name, tensor)


def _copy_stored_fused(module: nn.Module, target: str, kind: str, tensor) -> list[str]:
    """A checkpoint's fused Q/K/V or gate/up matrix, split into the shards it holds."""
    keys, start = [], 0
    for shard_id, rows in _shard_rows(module):
        part = RowRange(tensor, start, rows)
        module.weight_loader(getattr(module, kind), part, f"{target}.{kind}[{shard_id}]", shard_id)
        keys.append(f"{target}.{kind}.{shard_id}")
        start += rows
    return keys


def _shard_rows(module: nn.Module) -> list[tuple[object, int]]:
    """(shard id, rows in the whole checkpoint matrix) of a fused linear, in order."""
    if isinstance(module, QKVParallelLinear):
        return list(module.total_rows.items())
    return list(enumerate(module.total_output_sizes))


def _copy_plain(parent: nn.Module, name: str, tensor) -> list[str]:
    """A tensor whose module carries its HF name (norms, the output projections, sinks)."""
    module_name, _, kind = name.rpartition(".")
    try:
        module = parent.get_submodule(module_name)
    except AttributeError:
        return []  # not a weight Octavo uses (e.g. rotary inv_freq buffers)
    if isinstance(module, RowParallelLinear) and kind == "bias":
        kind = "reduced_bias"  # added once, after the all-reduce
    target = getattr(module, kind, None)
    if target is None:
        return []
    loader = getattr(module, "weight_loader", None)
    if loader is not None:
        loader(target, tensor, name)
    else:
        _assign(target, tensor, name)
    return [name.replace(".reduced_bias", ".bias")]


def _assign(parameter: torch.Tensor, tensor, name: str) -> None:
    if parameter.shape != tensor.shape:
        raise ValueError(
            f"{name}: checkpoint shape {tuple(tensor.shape)} != {tuple(parameter.shape)}"
        )
    parameter.copy_(materialize(tensor))


def expected_keys(model: CausalLM) -> set[str]:
    """Every key ``_copy_into`` must have filled for this rank's part of the model."""
    keys = set()
    if model.embed_tokens is not None:
        keys.add("embed_tokens.weight")
    if model.norm is not None:  # the last stage
        keys.add("norm.weight")
    if _lm_head_separate(model):
        keys.add("lm_head.weight")
    for index, layer in enumerate(model.layers, start=model.first_layer):
        keys.update(f"layers.{index}.{key}" for key in _layer_keys(layer))
    return keys | model.extra_weight_keys()


def _layer_keys(layer: nn.Module) -> set[str]:
    keys: set[str] = set()
    for name, module in layer.named_children():
        keys.update(f"{name}.{key}" for key in _module_keys(module))
    return keys


def _module_keys(module: nn.Module) -> set[str]:
    if hasattr(module, "expected_keys"):
        return module.expected_keys()
    if isinstance(module, QKVParallelLinear | MergedColumnParallelLinear):
        slots = ["q", "k", "v"] if isinstance(module, QKVParallelLinear) else None
        slots = slots or list(range(len(module.shards)))
        kinds = ["weight"] + (["bias"] if module.bias is not None else [])
        return {f"{kind}.{slot}" for kind in kinds for slot in slots}
    if isinstance(module, RowParallelLinear):
        return {"weight"} | ({"bias"} if module.reduced_bias is not None else set())
    keys = {name for name, _ in module.named_parameters(recurse=False)}
    for name, child in module.named_children():
        keys.update(f"{name}.{key}" for key in _module_keys(child))
    return keys
