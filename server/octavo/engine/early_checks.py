"""Checks ``octavo serve`` makes before its port opens, from what is at hand locally.

The checks of a parallel layout and of a quantization import what they need (torch) when
they apply: a plain ``octavo serve`` API process does without it."""

from __future__ import annotations

from pathlib import Path

from octavo.cache_dirs import cache_root
from octavo.model_executor.embedded import EMBEDDED_MODEL_NAME, baked_model_folder, is_model_folder
from octavo.model_executor.hub import parse_hub_model
from octavo.model_executor.model_config import ModelConfig
from octavo.model_executor.model_folders import resolve_model_folder


def check_parallel_layout_early(args) -> None:
    """Refuse a tensor/pipeline layout the model cannot take (e.g. 9 heads over 2 ranks)
    before a server opens its port, when the model's config is at hand without a download
    or a conversion. ``args`` is the ``EngineArgs``."""
    if args.tensor_parallel_size * args.pipeline_parallel_size == 1:
        return
    folder = _local_config_folder(args.model, args.revision)
    if folder is None:
        return  # checked again, as always, when the engine loads
    from octavo.distributed.parallel_config import ParallelConfig
    from octavo.engine.device import select_device

    layout = ParallelConfig(args.tensor_parallel_size, args.pipeline_parallel_size, args.nnodes)
    config = ModelConfig.from_folder(folder, args.hf_overrides)
    layout.check(config, select_device(args.device))


def check_quantization_early(args) -> None:
    """Refuse a ``--quantization`` the model does not fit (e.g. gptq on a float
    checkpoint, gguf without a .gguf file, an unsupported GGUF block type) before the port
    opens, when the model is at hand locally."""
    if args.quantization is None and (args.model is None or not args.model.endswith(".gguf")):
        return
    folder = _local_config_folder(args.model, args.revision)
    if folder is not None:
        from octavo.model_executor.quantized_checkpoint import resolve_quantization

        resolve_quantization(folder, args.quantization)


def _local_config_folder(model: str | None, revision: str | None) -> Path | None:
    if model is None:
        folder = baked_model_folder() or cache_root() / "models" / EMBEDDED_MODEL_NAME
        return folder if is_model_folder(folder) else None
    if parse_hub_model(model, revision) is None:
        return resolve_model_folder(model, revision)
    return None
