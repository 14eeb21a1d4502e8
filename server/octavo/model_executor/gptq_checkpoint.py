"""Reading GPTQ and AWQ 4-bit checkpoints, each linear as one ``QuantizedTensor``.

On disk (safetensors, beside a ``quantization_config`` in config.json), a linear
``prefix`` has ``prefix.qweight`` (int32, eight 4-bit values each), ``prefix.qzeros``
(int32, packed the same way), ``prefix.scales`` (fp16, one per group of ``group_size``
input columns and output column) and, for GPTQ, ``prefix.g_idx`` (each input column's
group). The layouts differ:

- GPTQ: ``qweight [in / 8, out]`` packs 8 consecutive *input* rows per int32, low nibble
  first; ``qzeros [groups, out / 8]`` packs output columns. The original ("gptq" v1)
  format stores each zero minus one; ``checkpoint_format: gptq_v2`` stores it as is.
- AWQ (GEMM): ``qweight [in, out / 8]`` and ``qzeros [groups, out / 8]`` pack 8 *output*
  columns per int32 in the order 0, 2, 4, 6, 1, 3, 5, 7.

Either way ``w[o, i] = scale[g, o] * (q[i, o] - zero[g, o])`` with ``g`` the column's
group. Each group becomes 32-column ``Q4_F32`` blocks (scale ``d = scale``, offset
``m = -scale * zero``, exact in fp32), so GPTQ, AWQ and GGUF share one kernel. GPTQ
act-order (a ``g_idx`` that is not ``i // group_size``) stores columns sorted by group
and keeps the order, applied to the activations.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from octavo.model_executor.layers.quantization.blocks import BLOCK, BlockKind
from octavo.model_executor.layers.quantization.quantized_tensor import QuantizedTensor

QUANTIZED_PARTS = ("qweight", "qzeros", "scales", "g_idx")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of an AWQ int32 holds column AWQ_ORDER[i]


def iterate_int4_checkpoint(
    folder: Path, method: str, settings: dict
) -> Iterator[tuple[str, object]]:
    """``(name, tensor)`` pairs: each quantized linear as ``prefix.weight``, the rest as is."""
    _check_settings(method, settings)
    tensors = _read_all(folder)
    prefixes = sorted(name[: -len(".qweight")] for name in tensors if name.endswith(".qweight"))
    for prefix in prefixes:
        parts = {part: tensors.pop(f"{prefix}.{part}", None) for part in QUANTIZED_PARTS}
        yield f"{prefix}.weight", to_blocks(method, settings, parts)
    yield from tensors.items()


def to_blocks(method: str, settings: dict, parts: dict) -> QuantizedTensor:
    """One linear's checkpoint tensors → ``Q4_F32`` blocks of its ``[out, in]`` matrix."""
    if method == "gptq":
        values = _unpack_rows(parts["qweight"])  # [in, out]
        zeros = _unpack_columns(parts["qzeros"])  # [groups, out]
        if settings.get("checkpoint_format", "gptq") != "gptq_v2":
            zeros = zeros + 1
    else:
        values = _unpack_columns(parts["qweight"], AWQ_ORDER)
        zeros = _unpack_columns(parts["qzeros"], AWQ_ORDER)
    scales = parts["scales"].float()  # [groups, out]
    inputs = values.shape[0]
    group_of = _group_of_columns(parts.get("g_idx"), inputs, settings)
    order = None
    if not torch.equal(group_of, torch.arange(inputs) // _group_size(settings, inputs)):
        order = torch.argsort(group_of, stable=True)
        values, group_of = values[order], group_of[order]
    return _pack(values.t(), scales.t(), zeros.t(), group_of, order)


def _pack(values, scales, zeros, group_of, order) -> QuantizedTensor:
    """``values [out, in]`` (0..15), per-group ``scales``/``zeros [out, groups]`` → blocks."""
    outputs, inputs = values.shape
    block_groups = group_of.reshape(-1, BLOCK)
    if not torch.all(block_groups == block_groups[:, :1]):
        raise ValueError(
            "a 32-column block spans two quantization groups (group size must be a multiple of 32)"
        )
    groups = block_groups[:, 0]
    d = scales[:, groups].contiguous()  # [out, blocks]
    m = (-scales[:, groups] * zeros[:, groups].float()).contiguous()
    nibbles = values.reshape(outputs, -1, 2, 16).to(torch.uint8)
    payload = nibbles[:, :, 0] | (nibbles[:, :, 1] << 4)  # byte j: column j low, j + 16 high
    blocks = torch.cat(
        [d.unsqueeze(-1).view(torch.uint8), m.unsqueeze(-1).view(torch.uint8), payload], dim=-1
    )
    return QuantizedTensor(
        blocks.reshape(outputs, -1).contiguous(), BlockKind.Q4_F32, inputs, order
    )


def _unpack_rows(packed: torch.Tensor) -> torch.Tensor:
    """int32 ``[rows / 8, cols]`` → ``[rows, cols]`` values, 8 rows per int32, low first."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    values = (packed.unsqueeze(1) >> shifts.view(1, 8, 1)) & 0xF
    return values.reshape(-1, packed.shape[1])


def _unpack_columns(packed: torch.Tensor, order=tuple(range(8))) -> torch.Tensor:
    """int32 ``[rows, cols / 8]`` → ``[rows, cols]``; nibble ``i`` holds column ``order[i]``."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    nibbles = (packed.unsqueeze(-1) >> shifts) & 0xF  # [rows, cols / 8, nibble]
    columns = torch.empty_like(nibbles)
    columns[..., list(order)] = nibbles
    return columns.reshape(packed.shape[0], -1)


def _group_of_columns(g_idx, inputs: int, settings: dict) -> torch.Tensor:
    if g_idx is not None:
        return g_idx.long()
    return torch.arange(inputs) // _group_size(settings, inputs)


def _group_size(settings: dict, inputs: int) -> int:
    size = int(settings.get("group_size", settings.get("q_group_size", 128)))
    return inputs if size == -1 else size


def _check_settings(method: str, settings: dict) -> None:
    bits = settings.get("bits", settings.get("w_bit", 4))
    if bits != 4:
        raise ValueError(f"{method} checkpoint with {bits}-bit weights: Octavo runs 4-bit only")
    if method == "awq" and settings.get("version", "gemm").lower() != "gemm":
        raise ValueError(f"AWQ version {settings['version']!r}: Octavo reads the GEMM layout")
    size = int(settings.get("group_size", settings.get("q_group_size", 128)))
    if size != -1 and size % BLOCK:
        raise ValueError(f"{method} group size {size}: Octavo needs a multiple of {BLOCK}")


def _read_all(folder: Path) -> dict[str, torch.Tensor]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors weights in {folder}")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as reader:
            for name in reader.keys():  # noqa: SIM118 (safe_open is not a mapping)
                tensors[name] = reader.get_tensor(name)
    return tensors
