"""sentence-transformers ``Dense`` modules: a linear layer and an activation on the pooled
vector, after Pooling and before Normalize (``modules.json``: Transformer → Pooling →
Dense → Normalize), as some embedding models ship a projection to a smaller size.

Each Dense folder holds ``config.json`` (``in_features``, ``out_features``, ``bias``,
``activation_function`` as a ``torch.nn`` class path, ``use_residual``) and its weights
(``model.safetensors`` or ``pytorch_model.bin``: ``linear.weight``, ``linear.bias``, and
``residual.weight`` for a residual projected to another size). The model applies them in
its ``pooling_head`` (``CausalLM.load_derived_weights`` loads them), in fp32.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from octavo.pooling.model_defaults import module_kind, sentence_transformer_modules

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
TORCH_NN = "torch.nn."


class DenseLayer(nn.Module):
    """``act(linear(x))``, plus ``x`` (or its projection) when ``use_residual``."""

    def __init__(self, settings: dict, folder: Path) -> None:
        super().__init__()
        size_in, size_out = int(settings["in_features"]), int(settings["out_features"])
        self.linear = nn.Linear(size_in, size_out, bias=bool(settings.get("bias", True)))
        self.act = activation_of(settings.get("activation_function"), folder)
        self.use_residual = bool(settings.get("use_residual", False))
        self.residual = None
        if self.use_residual and size_in != size_out:
            self.residual = nn.Linear(size_in, size_out, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.act(self.linear(x))
        if not self.use_residual:
            return out
        return out + (x if self.residual is None else self.residual(x))


def activation_of(path: str | None, folder: Path) -> nn.Module:
    """The ``torch.nn`` activation a config names (sentence-transformers' default: Tanh)."""
    if path is None:
        return nn.Tanh()
    cls = getattr(nn, path.rpartition(".")[2], None) if path.startswith(TORCH_NN) else None
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ValueError(
            f"{folder / 'config.json'}: activation_function {path!r} is not a torch.nn module"
        )
    return cls()


def dense_folders(folder: Path) -> list[Path]:
    """The folders of the model's Dense modules, in the order they apply."""
    modules = sentence_transformer_modules(folder) or []
    return [folder / module.get("path", "") for module in modules if module_kind(module) == "Dense"]


def dense_output_size(folder: Path) -> int | None:
    """The vector size after the last Dense module (None: the model has none)."""
    folders = dense_folders(folder)
    if not folders:
        return None
    return int(_settings(folders[-1])["out_features"])


def load_dense_layers(folder: Path, device: torch.device) -> list[DenseLayer]:
    """The model's Dense modules, in order, in fp32 on ``device`` (none: ``[]``)."""
    layers = []
    for path in dense_folders(folder):
        layer = DenseLayer(_settings(path), path)
        layer.load_state_dict(_weights(path))
        layers.append(layer.to(device=device, dtype=torch.float32).requires_grad_(False))
    return layers


def _settings(path: Path) -> dict:
    config = path / "config.json"
    if not config.is_file():
        raise ValueError(f"the sentence-transformers Dense module in {path} has no config.json")
    return json.loads(config.read_text())


def _weights(path: Path) -> dict[str, torch.Tensor]:
    for name in WEIGHT_FILES:
        if (path / name).is_file():
            break
    else:
        raise ValueError(f"the Dense module in {path} has none of {', '.join(WEIGHT_FILES)}")
    if name.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(path / name)
    return torch.load(path / name, map_location="cpu", weights_only=True)
