"""Writing GPTQ and AWQ 4-bit checkpoints of a float model, in their on-disk formats.

Each decoder linear ``W [out, in]`` is quantized asymmetrically per group of input
columns (``scale = (max - min) / 15`` rounded to fp16, ``zero = round(-min / scale)``),
then packed the way AutoGPTQ/GPTQModel ("gptq" v1: zeros stored minus one) and AutoAWQ
(GEMM: 8 output columns per int32 in the order 0, 2, 4, 6, 1, 3, 5, 7) write it. The
same model with each linear replaced by ``scale * (q - zero)`` in fp32 is written beside
it: the reference the quantized checkpoint must reproduce.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
AWQ_PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def quantize_groups(weight: torch.Tensor, g_idx: torch.Tensor):
    """``q [out, in]`` (0..15), ``scale``/``zero [groups, out]`` and the dequantized weight."""
    groups = int(g_idx.max()) + 1
    q = torch.empty_like(weight, dtype=torch.int32)
    scale = torch.empty(groups, weight.shape[0])
    zero = torch.empty(groups, weight.shape[0], dtype=torch.int32)
    for group in range(groups):
        columns = (g_idx == group).nonzero().squeeze(1)
        part = weight[:, columns]
        low, high = part.amin(dim=1).clamp(max=0), part.amax(dim=1).clamp(min=0)
        step = ((high - low).clamp(min=1e-6) / 15).half().float()
        offset = torch.round(-low / step).clamp(0, 15)
        q[:, columns] = (
            torch.round(part / step.unsqueeze(1) + offset.unsqueeze(1)).clamp(0, 15).int()
        )
        scale[group], zero[group] = step, offset.int()
    dequantized = scale[g_idx].t() * (q - zero[g_idx].t()).float()
    return q, scale, zero, dequantized


def pack_along_rows(values: torch.Tensor) -> torch.Tensor:
    """``[rows, cols]`` of 0..15 → int32 ``[rows / 8, cols]``, 8 rows per int32, low first."""
    grouped = values.reshape(-1, 8, values.shape[1]).long()
    packed = sum(grouped[:, j] << (4 * j) for j in range(8))
    return _to_int32(packed)


def pack_along_columns(values: torch.Tensor, order=tuple(range(8))) -> torch.Tensor:
    """``[rows, cols]`` → int32 ``[rows, cols / 8]``; nibble ``i`` holds column ``order[i]``."""
    grouped = values.reshape(values.shape[0], -1, 8).long()
    packed = sum(grouped[..., order[i]] << (4 * i) for i in range(8))
    return _to_int32(packed)


def _to_int32(packed: torch.Tensor) -> torch.Tensor:
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def gptq_tensors(q, scale, zero, g_idx) -> dict[str, torch.Tensor]:
    return {
        "qweight": pack_along_rows(q.t()),  # [in / 8, out]
        "qzeros": pack_along_columns(zero - 1),  # v1 format: zeros minus one
        "scales": scale.half(),
        "g_idx": g_idx.int(),
    }


def awq_tensors(q, scale, zero) -> dict[str, torch.Tensor]:
    return {
        "qweight": pack_along_columns(q.t(), AWQ_PACK_ORDER),  # [in, out / 8]
        "qzeros": pack_along_columns(zero, AWQ_PACK_ORDER),
        "scales": scale.half(),
    }


def write_int4_checkpoint(
    source: Path,
    out: Path,
    method: str,
    group_size: int = 32,
    act_order: bool = False,
    seed: int = 0,
) -> tuple[Path, Path]:
    """``out/quantized`` (the checkpoint) and ``out/reference`` (its dequantized twin)."""
    generator = torch.Generator().manual_seed(seed)
    quantized, reference = {}, {}
    for name, tensor in load_file(str(next(source.glob("*.safetensors")))).items():
        if not name.endswith(".weight") or name.split(".")[-2] not in LINEARS:
            quantized[name] = reference[name] = tensor
            continue
        inputs = tensor.shape[1]
        g_idx = torch.arange(inputs) // group_size
        if act_order:
            g_idx = g_idx[torch.randperm(inputs, generator=generator)]
        q, scale, zero, dequantized = quantize_groups(tensor.float(), g_idx)
        prefix = name.removesuffix(".weight")
        parts = (
            gptq_tensors(q, scale, zero, g_idx) if method == "gptq" else awq_tensors(q, scale, zero)
        )
        quantized.update({f"{prefix}.{part}": value for part, value in parts.items()})
        reference[name] = dequantized.to(tensor.dtype)
    settings = _quantization_config(method, group_size, act_order)
    return _write(source, out / "quantized", quantized, settings), _write(
        source, out / "reference", reference, None
    )


def _quantization_config(method: str, group_size: int, act_order: bool) -> dict:
    if method == "gptq":
        return {
            "quant_method": "gptq",
            "bits": 4,
            "group_size": group_size,
            "desc_act": act_order,
            "sym": False,
        }
    return {
        "quant_method": "awq",
        "bits": 4,
        "group_size": group_size,
        "version": "gemm",
        "zero_point": True,
    }


def _write(source: Path, folder: Path, tensors: dict, settings: dict | None) -> Path:
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    if settings is not None:
        config = json.loads((folder / "config.json").read_text())
        config["quantization_config"] = settings
        (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder
