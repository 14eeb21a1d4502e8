"""A PEFT adapter's ``adapter_model.safetensors``, checked against its config and the base.

Tensors are named ``base_model.model.model.layers.{i}.{self_attn|mlp}.{module}.lora_A.weight``
(``[r, in]``) and ``...lora_B.weight`` (``[out, r]``). The header is checked before any
weight is read: the file's size against the largest adapter of ``max_lora_rank`` the base
model can take, every name, dtype and shape (2-D, rank = the config's ``r``, in/out = the
base module's features), each module's A and B present; then the weights, which must be
finite. Every problem is a ``ValueError`` naming it.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors import safe_open

from octavo.lora.adapter_config import MODULES, WEIGHTS_FILE, AdapterSettings
from octavo.lora.fused_modules import fused_modules
from octavo.model_executor.model_config import ModelConfig

_KEY = re.compile(r"layers\.(\d{1,6})\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")
_FLOAT_DTYPES = {"F16", "BF16", "F32", "F64"}
_HEADER_ALLOWANCE = 1 << 20  # the JSON header of a safetensors file, generously

Key = tuple[int, str]  # (layer, module)
Weights = dict[Key, tuple[torch.Tensor, torch.Tensor]]


def module_shape(config: ModelConfig, module: str) -> tuple[int, int]:
    """(in, out) features of a base module, whole (before any tensor-parallel split); a
    fused module's out features are its pieces' together."""
    pieces = fused_modules(config).get(module)
    if pieces:
        shapes = [module_shape(config, piece) for piece in pieces]
        return shapes[0][0], sum(features_out for _, features_out in shapes)
    hidden, inter = config.hidden_size, config.intermediate_size
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    return {
        "q_proj": (hidden, q),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (q, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }[module]


def max_adapter_bytes(config: ModelConfig, max_rank: int) -> int:
    """The largest file an adapter of rank ``max_rank`` for this base can be (fp64)."""
    features = sum(sum(module_shape(config, module)) for module in MODULES)
    return config.num_layers * features * max_rank * 8 + _HEADER_ALLOWANCE


def read_weights(
    folder: Path, path: str, config: ModelConfig, settings: AdapterSettings, max_rank: int
) -> Weights:
    """The adapter's (A, B) per (layer, module), fp32, checked; ValueError naming a problem."""
    file = folder / WEIGHTS_FILE
    if not file.is_file():
        raise ValueError(f"LoRA adapter {path}: no {WEIGHTS_FILE}")
    _check_size(file, path, config, max_rank)
    try:
        with safe_open(str(file), framework="pt") as tensors:
            names = _check_header(tensors, path, config, settings.rank)
            loaded = {key: tensors.get_tensor(name) for name, key in names.items()}
    except ValueError:
        raise
    except Exception:  # safetensors' own errors: a truncated or corrupt file
        raise ValueError(
            f"LoRA adapter {path}: {WEIGHTS_FILE} is not a valid safetensors file"
        ) from None
    return _split_fused(_pairs(loaded, path), config, path)


def _check_size(file: Path, path: str, config: ModelConfig, max_rank: int) -> None:
    size, limit = file.stat().st_size, max_adapter_bytes(config, max_rank)
    if size > limit:
        raise ValueError(
            f"LoRA adapter {path}: {WEIGHTS_FILE} is {size} bytes, more than "
            f"an adapter of rank <= max_lora_rank={max_rank} for this model can "
            f"be ({limit} bytes)"
        )


def _check_header(tensors, path: str, config: ModelConfig, rank: int) -> dict[str, tuple]:
    """Tensor name -> (layer, module, "A" | "B"), every tensor's name, dtype and shape
    checked against the config's rank and the base model."""
    names: dict[str, tuple] = {}
    seen: dict[tuple, str] = {}
    stored = tensors.keys()  # safetensors' handle: no iteration of its own
    for name in stored:
        key = _key_of(name, path, config)
        if key in seen:
            raise ValueError(
                f"LoRA adapter {path}: tensors {seen[key]} and {name} both hold "
                f"layers.{key[0]}.{key[1]}.lora_{key[2]}"
            )
        seen[key] = name
        piece = tensors.get_slice(name)
        _check_tensor(name, piece.get_dtype(), piece.get_shape(), key, path, config, rank)
        names[name] = key
    halves = {(layer, module) for layer, module, _ in seen}
    missing = sorted(
        f"layers.{layer}.{module}.lora_{half}"
        for layer, module in halves
        for half in "AB"
        if (layer, module, half) not in seen
    )
    if missing or not halves:
        raise ValueError(
            f"LoRA adapter {path}: {WEIGHTS_FILE} lacks {missing[:3] or 'any lora_A/lora_B tensor'}"
        )
    return names


def _key_of(name: str, path: str, config: ModelConfig) -> tuple[int, str, str]:
    match = _KEY.search(name)
    if match is None or match.group(2) not in (*MODULES, *fused_modules(config)):
        raise ValueError(f"LoRA adapter {path}: tensor {name[:200]} adapts no supported layer")
    layer = int(match.group(1))
    if layer >= config.num_layers:
        raise ValueError(
            f"LoRA adapter {path}: layer {layer} does not exist in the base "
            f"model ({config.num_layers} layers)"
        )
    return layer, match.group(2), match.group(3)


def _check_tensor(
    name: str,
    dtype: str,
    shape: list[int],
    key: tuple[int, str, str],
    path: str,
    config: ModelConfig,
    rank: int,
) -> None:
    layer, module, half = key
    if dtype not in _FLOAT_DTYPES:
        raise ValueError(
            f"LoRA adapter {path}: tensor {name} is {dtype}; LoRA weights are "
            f"floating point ({', '.join(sorted(_FLOAT_DTYPES))})"
        )
    features_in, features_out = module_shape(config, module)
    expected = [rank, features_in] if half == "A" else [features_out, rank]
    if list(shape) == expected:
        return
    where = f"LoRA adapter {path}: layers.{layer}.{module}.lora_{half} is {tuple(shape)}"
    if len(shape) != 2:
        raise ValueError(f"{where}, a {len(shape)}-D tensor; expected {tuple(expected)}")
    rank_axis = 0 if half == "A" else 1
    if shape[rank_axis] != rank:
        raise ValueError(
            f"{where}, of rank {shape[rank_axis]}, but adapter_config.json "
            f"says r={rank}: expected {tuple(expected)}"
        )
    raise ValueError(
        f"{where}, but the base model's {module} is {features_in} -> "
        f"{features_out} (expected {tuple(expected)}): an adapter for another "
        "base model?"
    )


def _pairs(loaded: dict[tuple, torch.Tensor], path: str) -> Weights:
    weights: Weights = {}
    for (layer, module, half), tensor in loaded.items():
        if half != "A":
            continue
        a, b = tensor.float(), loaded[(layer, module, "B")].float()
        if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
            raise ValueError(
                f"LoRA adapter {path}: layers.{layer}.{module} holds NaN or infinite weights"
            )
        weights[(layer, module)] = (a, b)
    return weights


def _split_fused(weights: Weights, config: ModelConfig, path: str) -> Weights:
    """Each fused module's (A, B) as one (A, rows of B) per piece it holds."""
    fused = fused_modules(config)
    split: Weights = {}
    for (layer, module), (a, b) in weights.items():
        pieces = fused.get(module, (module,))
        rows = [module_shape(config, piece)[1] for piece in pieces]
        for piece, b_rows in zip(pieces, b.split(rows), strict=True):
            if (layer, piece) in split:
                raise ValueError(
                    f"LoRA adapter {path}: layers.{layer}.{piece} is adapted twice "
                    f"(on its own and as part of a fused module)"
                )
            split[(layer, piece)] = (a, b_rows.contiguous())
    return split
