"""The block kinds quantized weights are kept in: their numbers, bytes and columns."""

from __future__ import annotations

from enum import IntEnum

BLOCK = 32
SUPER_BLOCK = 256  # columns of a K-quant block


class BlockKind(IntEnum):
    """GGML's type numbers for the GGUF kinds; Octavo's own from 100."""

    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q4_F32 = 100
    INT8_ROWS = 101
    FP8_ROWS = 102  # e4m3fn with one scale per row; dequantized only (the fp8 CPU path)


BLOCK_BYTES = {
    BlockKind.Q4_0: 18,
    BlockKind.Q4_1: 20,
    BlockKind.Q5_0: 22,
    BlockKind.Q5_1: 24,
    BlockKind.Q8_0: 34,
    BlockKind.Q4_K: 144,
    BlockKind.Q5_K: 176,
    BlockKind.Q6_K: 210,
    BlockKind.Q4_F32: 24,
    BlockKind.INT8_ROWS: 32,
    BlockKind.FP8_ROWS: 32,
}


SUPER_BLOCK_KINDS = frozenset({BlockKind.Q4_K, BlockKind.Q5_K, BlockKind.Q6_K})


def block_columns(kind: BlockKind) -> int:
    """Columns one block of ``kind`` holds: 256 for the K-quants, else 32."""
    return SUPER_BLOCK if kind in SUPER_BLOCK_KINDS else BLOCK
