"""Reading a PEFT LoRA adapter and checking it against the base model.

A PEFT folder holds ``adapter_config.json`` (``r``, ``lora_alpha``, ``target_modules``,
``use_rslora``...; checked in ``adapter_config``) and ``adapter_model.safetensors`` with,
per adapted module, ``lora_A`` ``[r, in]`` and ``lora_B`` ``[out, r]`` (checked in
``adapter_tensors``). The delta of a module is ``scaling * B @ A``.

A hub adapter (``hf://ORG/NAME[@REV]``) is read from the local cache when it is there:
the server downloads run-time adapters before the engine sees them (off the event loop
and off the engine loop), and ``fetch_adapter`` downloads ``--lora-modules`` at start, so
the engine and its workers never wait on the network while serving.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from octavo.lora.adapter_config import (
    CONFIG_FILE,
    MODULES,
    WEIGHTS_FILE,
    not_an_adapter,
    read_settings,
)
from octavo.lora.adapter_tensors import module_shape, read_weights
from octavo.lora.fused_modules import fused_modules
from octavo.model_executor.hub import (
    HubModel,
    cached_snapshot,
    download_snapshot,
    parse_hub_model,
)
from octavo.model_executor.model_config import ModelConfig

__all__ = [
    "MODULES",
    "PeftAdapter",
    "adapter_folder",
    "fetch_adapter",
    "load_peft_adapter",
    "module_shape",
]
ADAPTER_FILES = [CONFIG_FILE, WEIGHTS_FILE]  # all a hub adapter download fetches


@dataclass
class PeftAdapter:
    rank: int
    scaling: float
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]  # (layer, module) -> A, B


def load_peft_adapter(path: str, config: ModelConfig, max_rank: int) -> PeftAdapter:
    """The adapter at ``path``; ValueError naming what is wrong with it."""
    folder = adapter_folder(path)
    settings = read_settings(folder, path, max_rank, tuple(fused_modules(config)))
    weights = read_weights(folder, path, config, settings, max_rank)
    return PeftAdapter(settings.rank, settings.scaling, weights)


def adapter_folder(path: str) -> Path:
    """A local folder, ``file://PATH`` or ``hf://ORG/NAME[@REV]`` (the cached snapshot, or
    downloaded unless ``HF_HUB_OFFLINE``); ValueError when it is none of them."""
    hub = hub_adapter(path)
    if hub is not None:
        folder = cached_snapshot(hub) or fetch_adapter(hub)
        if not (folder / CONFIG_FILE).is_file():
            raise not_an_adapter(path)
        return folder
    folder = Path(path.removeprefix("file://")).expanduser()
    if not folder.is_dir():
        raise not_an_adapter(path)
    return folder


def hub_adapter(path: str) -> HubModel | None:
    """The hub repository ``path`` names, None for a local path; ValueError if malformed."""
    try:
        return parse_hub_model(path)
    except ValueError as error:
        raise ValueError(f"LoRA adapter {path}: {error}") from None


def fetch_adapter(hub: HubModel) -> Path:
    """Download (unless offline) the adapter files of ``hub``; its snapshot folder."""
    try:
        return download_snapshot(hub, marker=CONFIG_FILE, patterns=ADAPTER_FILES)
    except ValueError as error:
        raise ValueError(f"LoRA adapter {hub.uri!r}: {_hub_reason(error)}") from error


def _hub_reason(error: ValueError) -> str:
    """Why a download failed, without the server's cache folder in it."""
    text = str(error)
    if "not in the local Hugging Face cache" in text:
        return "not in the local Hugging Face cache, and it could not be downloaded"
    if f"has no {CONFIG_FILE}" in text:
        return f"the repository has no {CONFIG_FILE}: not a LoRA adapter"
    return text.split(": ", 1)[-1]
