"""Weights kept in quantized blocks, and the linears that use them.

The block kinds are GGUF's (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 of 32 columns; the K-quants
Q4_K, Q5_K, Q6_K of 256: llama.cpp's layout, byte for byte, see ``gguf_blocks.py``) and
Octavo's own: ``Q4_F32`` (4-bit with fp32 scale and offset, what GPTQ and AWQ groups
become), ``INT8_ROWS`` (int8 with one scale per row, the ``int8`` method's weights) and
``FP8_ROWS``. Each row of a ``[rows, cols]`` matrix is ``cols / block_columns(kind)``
blocks side by side; within a 4-bit block byte ``j`` holds column ``j`` (low nibble) and
column ``j + 16`` (high nibble).

``blocks_linear`` computes ``x @ W.T``: on CPU, a few rows (decode) go through the native
integer kernel (activations quantized per block of 32, llama.cpp's scheme); many rows
(prefill) dequantize the weights once into the activations' dtype and run a float GEMM.
Elsewhere (no native kernels, GPU) the torch dequantization below serves.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from octavo.kernels.cpu_build import NATIVE_DTYPES, cpu_ops
from octavo.model_executor.layers.quantization.block_kinds import (  # noqa: F401 (re-exported)
    BLOCK,
    BLOCK_BYTES,
    BlockKind,
    block_columns,
)
from octavo.model_executor.layers.quantization.gguf_blocks import GGUF_ONLY_KINDS, dequantize_gguf

# Up to this many rows the integer kernel beats dequantizing + a float GEMM (which writes the
# whole matrix as floats every call). A 1536 x 576 matrix on the AVX2-only AMD EPYC, kernel
# time / dequantized time: 2 threads 0.10-0.16 at 4 rows, 0.23-0.48 at 16, 0.55-0.82 at 32,
# 0.9-1.3 at 64 over every kind; 1 thread 0.72-1.19 at 16 (8-bit kinds the slower).
NATIVE_MAX_ROWS = 16


def row_bytes(kind: BlockKind, cols: int) -> int:
    columns = block_columns(kind)
    if cols % columns:
        raise ValueError(f"{cols} columns do not split into {kind.name} blocks of {columns}")
    return cols // columns * BLOCK_BYTES[kind]


def dequantize(
    blocks: torch.Tensor, kind: BlockKind, row_scale: torch.Tensor | None = None
) -> torch.Tensor:
    """The float32 ``[rows, cols]`` matrix the blocks stand for (torch ops, any device)."""
    if kind in GGUF_ONLY_KINDS:
        weight = dequantize_gguf(blocks, kind)
        return weight if row_scale is None else weight * row_scale.unsqueeze(-1)
    rows = blocks.shape[0]
    per_block = blocks.reshape(rows, -1, BLOCK_BYTES[kind])
    scale, offset, payload = split_blocks(per_block, kind)
    values = block_values(payload, kind)
    if kind not in (BlockKind.FP8_ROWS, BlockKind.INT8_ROWS):  # those have no block scale
        values.mul_(scale.unsqueeze(-1)).add_(offset.unsqueeze(-1))
    weight = values.reshape(rows, -1)
    return weight if row_scale is None else weight.mul_(row_scale.unsqueeze(-1))


def block_values(payload: torch.Tensor, kind: BlockKind) -> torch.Tensor:
    """A new float32 ``[rows, blocks, columns]`` tensor of the blocks' codes (before the
    scale and offset), written in place: the torch path runs this for every weight at
    every step, so it makes one float tensor, not several (3.4x faster than cat + float
    + multiply + add on a 1536 x 576 Q4_1 matrix, one thread)."""
    if kind == BlockKind.FP8_ROWS:
        return payload.view(torch.float8_e4m3fn).float()
    if kind == BlockKind.Q8_0 or kind == BlockKind.INT8_ROWS:
        return payload.view(torch.int8).float()
    rows, blocks, half = payload.shape
    values = torch.empty(rows, blocks, 2, half, dtype=torch.float32, device=payload.device)
    values[:, :, 0].copy_(payload & 0x0F)  # column j: the low nibble of byte j
    values[:, :, 1].copy_(payload >> 4)  # column j + 16: its high nibble
    return values.view(rows, blocks, 2 * half)


def split_blocks(per_block: torch.Tensor, kind: BlockKind):
    """(scale, offset, payload bytes) of ``[rows, blocks, bytes]`` blocks."""

    def half(start: int) -> torch.Tensor:
        return per_block[..., start : start + 2].contiguous().view(torch.float16)[..., 0].float()

    def single(start: int) -> torch.Tensor:
        return per_block[..., start : start + 4].contiguous().view(torch.float32)[..., 0]

    zeros = torch.zeros(per_block.shape[:2], device=per_block.device)
    if kind == BlockKind.Q4_0:
        return half(0), -8.0 * half(0), per_block[..., 2:]
    if kind == BlockKind.Q4_1:
        return half(0), half(2), per_block[..., 4:]
    if kind == BlockKind.Q8_0:
        return half(0), zeros, per_block[..., 2:]
    if kind == BlockKind.Q4_F32:
        return single(0), single(4), per_block[..., 8:]
    return zeros + 1.0, zeros, per_block


def blocks_linear(
    x: torch.Tensor, blocks: torch.Tensor, kind: BlockKind, row_scale: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ W.T`` for ``[..., cols]`` activations; the result in ``x``'s dtype."""
    rows = x.reshape(-1, x.shape[-1])
    ops = cpu_ops() if x.device.type == "cpu" else None
    if ops is not None and rows.shape[0] <= NATIVE_MAX_ROWS and x.dtype in NATIVE_DTYPES:
        out = torch.empty(rows.shape[0], blocks.shape[0], dtype=x.dtype)
        ops.quantized_linear(out, rows.contiguous(), blocks, int(kind), row_scale)
        return out.view(*x.shape[:-1], -1)
    return F.linear(x, dequantize_like(x, blocks, kind, row_scale, ops))


def dequantize_like(
    x: torch.Tensor, blocks: torch.Tensor, kind: BlockKind, row_scale, ops=None
) -> torch.Tensor:
    """The weights in ``x``'s dtype: the native kernel on CPU when it can, else torch."""
    cols = blocks.shape[1] // BLOCK_BYTES[kind] * block_columns(kind)
    if ops is not None and x.dtype in (torch.float32, torch.bfloat16):
        weight = torch.empty(blocks.shape[0], cols, dtype=x.dtype)
        ops.dequantize_blocks(weight, blocks, int(kind), row_scale)
        return weight
    return dequantize(blocks, kind, row_scale).to(x.dtype)
