"""Reading a PEFT LoRA adapter and checking it against the base model.

A PEFT folder holds ``adapter_config.json`` (``r``, ``lora_alpha``, ``target_modules``,
``use_rslora``...) and ``adapter_model.safetensors`` with, per adapted module,
``base_model.model.model.layers.{i}.{self_attn|mlp}.{name}.lora_A.weight`` ``[r, in]``
and ``lora_B.weight`` ``[out, r]``. The delta of a module is ``scaling * B @ A``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from octavo.model_executor.hub import download_snapshot, parse_hub_model
from octavo.model_executor.model_config import ModelConfig

MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")
UNSUPPORTED_OPTIONS = ("use_dora", "modules_to_save", "rank_pattern", "alpha_pattern",
                       "layers_to_transform")  # fmt: skip


@dataclass
class PeftAdapter:
    rank: int
    scaling: float
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]  # (layer, module) -> A, B


def load_peft_adapter(path: str, config: ModelConfig, max_rank: int) -> PeftAdapter:
    """The adapter at ``path``; ValueError naming what is wrong with it."""
    folder = adapter_folder(path)
    settings = _settings(folder)
    rank = int(settings.get("r", 0))
    if not 1 <= rank <= max_rank:
        raise ValueError(f"LoRA adapter {path}: rank {rank} is outside [1, max_lora_rank="
                         f"{max_rank}]")  # fmt: skip
    alpha = float(settings.get("lora_alpha", rank))
    scaling = alpha / rank**0.5 if settings.get("use_rslora") else alpha / rank
    weights = _weights(folder, path)
    _check_shapes(weights, config, path)
    return PeftAdapter(rank, scaling, weights)


def adapter_folder(path: str) -> Path:
    """A local folder, ``file://PATH`` or ``hf://ORG/NAME[@REV]`` (downloaded to the hub
    cache unless ``HF_HUB_OFFLINE``); ValueError when it is none of them."""
    try:
        hub = parse_hub_model(path)
    except ValueError as error:
        raise ValueError(f"LoRA adapter {path}: {error}") from None
    if hub is not None:
        return download_snapshot(hub, marker="adapter_config.json")
    folder = Path(path.removeprefix("file://")).expanduser()
    if not folder.is_dir():
        raise ValueError(f"LoRA adapter {path}: no such folder")
    return folder


def _settings(folder: Path) -> dict:
    config_file = folder / "adapter_config.json"
    if not config_file.is_file():
        raise ValueError(f"LoRA adapter {folder}: no adapter_config.json")
    try:
        settings = json.loads(config_file.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"LoRA adapter {folder}: adapter_config.json is not JSON "
                         f"({error.msg})") from None  # fmt: skip
    if str(settings.get("peft_type", "LORA")).upper() != "LORA":
        raise ValueError(
            f"LoRA adapter {folder}: peft_type {settings.get('peft_type')!r} is not LORA"
        )
    used = [key for key in UNSUPPORTED_OPTIONS if settings.get(key)]
    if used or settings.get("bias", "none") != "none":
        raise ValueError(f"LoRA adapter {folder}: unsupported options {used or ['bias']}")
    targets = settings.get("target_modules") or []
    unknown = sorted(set([targets] if isinstance(targets, str) else targets) - set(MODULES))
    if unknown:
        raise ValueError(f"LoRA adapter {folder}: target modules {unknown} are not in the "
                         f"model's adaptable layers {list(MODULES)}")  # fmt: skip
    return settings


def _weights(folder: Path, path: str) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    files = [folder / "adapter_model.safetensors"]
    if not files[0].is_file():
        raise ValueError(f"LoRA adapter {path}: no adapter_model.safetensors")
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for name, tensor in load_file(files[0]).items():
        match = _KEY.search(name)
        if match is None or match.group(2) not in MODULES:
            raise ValueError(f"LoRA adapter {path}: tensor {name} adapts no supported layer")
        halves.setdefault((int(match.group(1)), match.group(2)), {})[match.group(3)] = tensor
    incomplete = [key for key, pair in halves.items() if set(pair) != {"A", "B"}]
    if incomplete or not halves:
        raise ValueError(f"LoRA adapter {path}: missing lora_A/lora_B for {incomplete[:3]}")
    return {key: (pair["A"].float(), pair["B"].float()) for key, pair in halves.items()}


def module_shape(config: ModelConfig, module: str) -> tuple[int, int]:
    """(in, out) features of a base module, whole (before any tensor-parallel split)."""
    hidden, inter = config.hidden_size, config.intermediate_size
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    return {"q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv),
            "o_proj": (q, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
            "down_proj": (inter, hidden)}[module]  # fmt: skip


def _check_shapes(weights, config: ModelConfig, path: str) -> None:
    for (layer, module), (a, b) in weights.items():
        if layer >= config.num_layers:
            raise ValueError(f"LoRA adapter {path}: layer {layer} does not exist in the base "
                             f"model ({config.num_layers} layers)")  # fmt: skip
        features_in, features_out = module_shape(config, module)
        if a.shape[1] != features_in or b.shape[0] != features_out or a.shape[0] != b.shape[1]:
            raise ValueError(
                f"LoRA adapter {path}: layers.{layer}.{module} has A {tuple(a.shape)} and B "
                f"{tuple(b.shape)}, but the base model's {module} is {features_in} -> "
                f"{features_out}: an adapter for another base model?"
            )
