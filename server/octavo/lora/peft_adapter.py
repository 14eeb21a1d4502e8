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

import torch

from octavo.lora.adapter_config import read_settings
from octavo.lora.adapter_source import adapter_folder
from octavo.lora.adapter_tensors import read_weights
from octavo.lora.fused_modules import fused_modules
from octavo.model_executor.model_config import ModelConfig


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
