"""Torch dequantization of GGUF's 5-bit blocks and K-quants, exactly as ``gguf.quants``.

Layouts are llama.cpp's (``ggml-common.h``), per block:

- ``Q5_0`` (32 columns, 22 bytes): fp16 d, 4 bytes of fifth bits (bit c: column c),
  16 bytes of nibbles (byte j: column j low, j + 16 high); ``w = d * (q - 16)``.
- ``Q5_1`` (24 bytes): fp16 d, fp16 m, fifth bits, nibbles; ``w = d * q + m``.
- ``Q4_K`` (256 columns, 144 bytes): fp16 d, fp16 dmin, 12 bytes of 6-bit scale and min
  per 32 columns, 128 bytes of nibbles (bytes 32i..32i+31: columns 64i.. low, 64i+32.. high);
  ``w = d * scale * q - dmin * min``.
- ``Q5_K`` (176 bytes): as Q4_K with 32 bytes of fifth bits (bit j of byte l: column 32j + l)
  before the nibbles.
- ``Q6_K`` (210 bytes): 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales
  (one per 16 columns), fp16 d; ``w = d * scale * (q - 32)``.

Each function does gguf's float32 operations in gguf's order, so the result is bit-equal to
``gguf.quants.dequantize`` (the native kernel's ``dequantize_blocks`` is too).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from octavo.model_executor.layers.quantization.block_kinds import BLOCK_BYTES, BlockKind


def dequantize_gguf(blocks: torch.Tensor, kind: BlockKind) -> torch.Tensor:
    """``[rows, bytes]`` uint8 blocks of one of ``GGUF_ONLY_KINDS`` → float32 ``[rows, cols]``."""
    rows = blocks.shape[0]
    per_block = blocks.reshape(-1, BLOCK_BYTES[kind])
    return _DEQUANTIZERS[kind](per_block).reshape(rows, -1)


def _fp16(raw: torch.Tensor) -> torch.Tensor:
    """``[n, 2]`` bytes → ``[n, 1]`` float32."""
    return raw.contiguous().view(torch.float16).float()


def _nibbles(raw: torch.Tensor) -> torch.Tensor:
    """``[..., 16]`` bytes of a 32-column block → its 32 low/high nibbles in column order."""
    return torch.cat([raw & 0x0F, raw >> 4], dim=-1).long()


def _bits(raw: torch.Tensor, width: int) -> torch.Tensor:
    """``[n, bytes]`` → ``[n, bytes * 8 / width]`` fields of ``width`` bits, low first."""
    shifts = torch.arange(0, 8, width, device=raw.device)
    fields = (raw.long().unsqueeze(-1) >> shifts) & ((1 << width) - 1)
    return fields.flatten(-2)


def _q5_0(block: torch.Tensor) -> torch.Tensor:
    d = _fp16(block[:, :2])
    q = _nibbles(block[:, 6:22]) | (_bits(block[:, 2:6], 1) << 4)
    return d * (q - 16).float()


def _q5_1(block: torch.Tensor) -> torch.Tensor:
    d, m = _fp16(block[:, :2]), _fp16(block[:, 2:4])
    q = _nibbles(block[:, 8:24]) | (_bits(block[:, 4:8], 1) << 4)
    return d * q.float() + m


def _scales_and_mins(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's 12 bytes → ``[n, 8]`` 6-bit scales and mins."""
    packed = packed.long()
    low, high, tops = packed[:, :4], packed[:, 4:8], packed[:, 8:]
    scales = torch.cat([low & 0x3F, (tops & 0x0F) | ((low >> 2) & 0x30)], dim=-1)
    mins = torch.cat([high & 0x3F, (tops >> 4) | ((high >> 2) & 0x30)], dim=-1)
    return scales, mins


def _k_scaled(block: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Q4_K/Q5_K: ``[n, 8, 32]`` integers → ``d * scale * q - dmin * min``."""
    d, dmin = _fp16(block[:, :2]), _fp16(block[:, 2:4])
    scales, mins = _scales_and_mins(block[:, 4:16])
    scale = (d * scales.float()).unsqueeze(-1)
    offset = (dmin * mins.float()).unsqueeze(-1)
    return (scale * q.float() - offset).flatten(1)


def _paired_nibbles(raw: torch.Tensor) -> torch.Tensor:
    """128 bytes → ``[n, 8, 32]``: sub-block 2i the low nibbles of bytes 32i.., 2i + 1 the high."""
    pairs = raw.reshape(-1, 4, 1, 32).long()
    return ((pairs >> torch.tensor([[0], [4]], device=raw.device)) & 0x0F).reshape(-1, 8, 32)


def _q4_k(block: torch.Tensor) -> torch.Tensor:
    return _k_scaled(block, _paired_nibbles(block[:, 16:144]))


def _q5_k(block: torch.Tensor) -> torch.Tensor:
    shifts = torch.arange(8, device=block.device).reshape(1, 8, 1)
    fifth = (block[:, 16:48].long().unsqueeze(1) >> shifts) & 1
    return _k_scaled(block, _paired_nibbles(block[:, 48:176]) | (fifth << 4))


def _q6_k(block: torch.Tensor) -> torch.Tensor:
    low_shifts = torch.tensor([0, 4], device=block.device).reshape(1, 1, 2, 1)
    high_shifts = torch.tensor([0, 2, 4, 6], device=block.device).reshape(1, 1, 4, 1)
    low = (block[:, :128].reshape(-1, 2, 1, 64).long() >> low_shifts) & 0x0F
    high = (block[:, 128:192].reshape(-1, 2, 1, 32).long() >> high_shifts) & 0x03
    q = (low.reshape(-1, 8, 32) | (high.reshape(-1, 8, 32) << 4)) - 32
    scales = block[:, 192:208].contiguous().view(torch.int8).float()
    scale = (_fp16(block[:, 208:210]) * scales).unsqueeze(-1)
    return (scale * q.reshape(-1, 16, 16).float()).flatten(1)


_DEQUANTIZERS: dict[BlockKind, Callable[[torch.Tensor], torch.Tensor]] = {
    BlockKind.Q5_0: _q5_0,
    BlockKind.Q5_1: _q5_1,
    BlockKind.Q4_K: _q4_k,
    BlockKind.Q5_K: _q5_k,
    BlockKind.Q6_K: _q6_k,
}
GGUF_ONLY_KINDS = frozenset(_DEQUANTIZERS)  # dequantized here, not by blocks.split_blocks
