"""gpt-oss's MXFP4 expert weights, dequantized as transformers'
``integrations/mxfp4.py`` (``convert_moe_packed_tensors``) does: per expert and call where
the experts are kept 4-bit (``mxfp4_experts.py``), else once at load.

Each group of 32 values along a row is 16 bytes of e2m1 codes (two per byte, the low
nibble first) and one e8m0 scale byte (a power of two, biased by 127).
"""

from __future__ import annotations

import torch

FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
FP4_VALUES = FP4_VALUES + tuple(-value for value in FP4_VALUES)  # codes 8..15: sign bit set
SCALE_BIAS = 127
BLOCK_VALUES = 32


def dequantize_mxfp4(
    blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """``blocks [..., G, 16]`` (uint8) and ``scales [..., G]`` → ``[..., G * 32]`` in
    ``dtype``. (transformers returns the last two dimensions of a 3-D result swapped.)"""
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != BLOCK_VALUES // 2:
        raise ValueError(
            f"MXFP4 blocks {tuple(blocks.shape)} do not match scales {tuple(scales.shape)}"
        )
    codes = blocks.to(torch.uint8).reshape(-1).to(torch.int32)
    values = byte_pairs(codes.device).index_select(0, codes).view(*scales.shape, BLOCK_VALUES)
    exponents = scales.to(torch.int32).sub(SCALE_BIAS).unsqueeze(-1)
    half = torch.div(exponents, 2, rounding_mode="floor")  # 2 ** 128 overflows in one factor
    values = values.mul_(torch.exp2(half.float())).mul_(torch.exp2((exponents - half).float()))
    values = values.to(dtype)  # torch.ldexp's values, bit for bit (it took 3/4 of the time)
    return values.reshape(*scales.shape[:-1], scales.shape[-1] * BLOCK_VALUES)


def byte_pairs(device: torch.device) -> torch.Tensor:
    """``[256, 2]`` float32: each byte's two values (low nibble, high nibble), so one gather
    per byte (with the two multiplies: 46 against 184 ms for a 2880 x 2880 matrix on one
    CPU thread, which took a lookup per nibble and ``torch.ldexp``)."""
    values = torch.tensor(FP4_VALUES, device=device)
    return torch.stack((values.repeat(16), values.repeat_interleave(16)), dim=-1)
