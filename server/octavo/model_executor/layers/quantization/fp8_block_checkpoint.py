"""Reading FP8 block-quantized checkpoints (``quantization_config``: ``quant_method`` fp8,
``fmt`` e4m3, ``activation_scheme`` dynamic, ``weight_block_size [out, in]``).

Each quantized linear ``prefix`` has ``prefix.weight`` (float8_e4m3fn) and
``prefix.weight_scale_inv`` (float32, one per tile); the reader hands them over together
as one ``Fp8BlockTensor`` named ``prefix.weight``. Everything the checkpoint left
unquantized (``modules_to_not_convert``, routers, norms, embeddings, the LM head) is an
ordinary tensor, read lazily as the plain loader reads it.

Activations stay in the model's dtype: "dynamic" quantizes them per token group on
FP8 hardware, which changes nothing a weight-dequantizing path computes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

from safetensors import safe_open

from octavo.model_executor.checkpoint_slice import CheckpointSlice
from octavo.model_executor.layers.quantization.fp8_blocks import Fp8BlockTensor

SCALE_SUFFIX = ".weight_scale_inv"


def block_size(settings: dict) -> tuple[int, int]:
    """The tile of a checkpoint's ``quantization_config``; ValueError for FP8 checkpoints
    Octavo does not read (per-tensor scales, e5m2, static activation scales)."""
    block = settings.get("weight_block_size")
    if not block or len(block) != 2:
        raise ValueError(
            "fp8 checkpoint without weight_block_size (per-tensor scales): Octavo reads "
            "block-quantized FP8 checkpoints ([128, 128] tiles, DeepSeek-V3's format)"
        )
    if settings.get("fmt", "e4m3") != "e4m3":
        raise ValueError(f"fp8 checkpoint in {settings['fmt']}: Octavo reads e4m3")
    if settings.get("activation_scheme", "dynamic") != "dynamic":
        raise ValueError("fp8 checkpoint with static activation scales: Octavo reads dynamic")
    return int(block[0]), int(block[1])


def iterate_fp8_block_checkpoint(folder: Path, settings: dict) -> Iterator[tuple[str, object]]:
    """``(name, tensor)`` pairs: each quantized linear as ``prefix.weight`` (one
    ``Fp8BlockTensor``), the rest as ``CheckpointSlice``s."""
    block = block_size(settings)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors weights in {folder}")
    with ExitStack() as stack:
        readers = {}
        for file in files:
            reader = stack.enter_context(safe_open(str(file), framework="pt"))
            readers.update(dict.fromkeys(reader.keys(), reader))
        for name, reader in readers.items():
            if name.endswith(SCALE_SUFFIX):
                continue
            scale_name = name.removesuffix(".weight") + SCALE_SUFFIX
            if name.endswith(".weight") and scale_name in readers:
                scale = readers[scale_name].get_tensor(scale_name).float()
                yield name, Fp8BlockTensor(reader.get_tensor(name), scale, block)
            else:
                yield name, CheckpointSlice(reader.get_slice(name))


def is_fp8_block_checkpoint(settings: dict | None) -> bool:
    return bool(settings) and settings.get("quant_method") == "fp8"
