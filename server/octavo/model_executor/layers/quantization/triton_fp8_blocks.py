"""FP8 block weights on GPU: a Triton GEMM that reads the e4m3 tiles as stored.

``out[m, n] = sum_k x[m, k] * fp8[n, k] * scale[(n + row phase) // block_out,
(k + column phase) // block_in]``: each ``BLOCK_K x BLOCK_N`` slice of the weights is
loaded in FP8, widened and multiplied by its elements' tile scales in registers, then
``tl.dot`` accumulates in fp32. Scales are looked up per element, so any tile size and
any slice (a tensor-parallel rank's, starting inside a tile) run the same kernel. The
FP8 bytes widen with integer operations (``kernels/triton_fp8_bits.py``), so GPUs without
fp8 instructions (A100, A10) run it too.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from octavo.kernels.triton_fp8_bits import E4M3_CODE, E4M3_HALF_FACTOR, fp8_to_half
from octavo.model_executor.layers.quantization.fp8_blocks import Fp8BlockTensor
from octavo.model_executor.layers.quantization.triton_kernels import (
    _output_tile,
    _store_tile,
    _tiles,
)


@triton.jit(do_not_specialize=["M"])  # the step's token count: one compile for all
def _fp8_block_matmul_kernel(
    x_ptr,
    w_ptr,
    scale_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    scale_cols,
    block_out,
    block_in,
    phase_out,
    phase_in,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    offs_m, offs_n, mask_m, mask_n = _output_tile(M, N, BLOCK_M, BLOCK_N)
    tile_row = (offs_n[None, :] + phase_out) // block_out  # [1, BLOCK_N]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        offs_k = start + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
            mask=mask_m[:, None] & mask_k[None, :],
            other=0.0,
        )
        mask_w = mask_n[None, :] & mask_k[:, None]  # a [BLOCK_K, BLOCK_N] tile of w^T
        w = tl.load(w_ptr + offs_n[None, :] * stride_wn + offs_k[:, None], mask=mask_w, other=0)
        tile = tile_row * scale_cols + (offs_k[:, None] + phase_in) // block_in
        scale = tl.load(scale_ptr + tile, mask=mask_w, other=0.0) * E4M3_HALF_FACTOR
        w = fp8_to_half(w, E4M3_CODE).to(tl.float32) * scale  # (value / 256) * (scale * 256)
        acc += tl.dot(x, w.to(x.dtype), input_precision="ieee")
    _store_tile(out_ptr, acc, offs_m, offs_n, mask_m, mask_n, stride_om)


def fp8_block_linear(x: torch.Tensor, matrix: Fp8BlockTensor) -> torch.Tensor:
    """``x @ W.T`` for ``[..., cols]`` activations, in ``x``'s dtype."""
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    weight, scale = matrix.weight, matrix.scale.float().contiguous()
    count, n, k = rows.shape[0], weight.shape[0], weight.shape[1]
    out = torch.empty(count, n, dtype=x.dtype, device=x.device)
    block_m, block_n, block_k = _tiles(count)
    grid = (triton.cdiv(count, block_m), triton.cdiv(n, block_n))
    _fp8_block_matmul_kernel[grid](
        rows,
        weight.view(torch.uint8),
        scale,
        out,
        count,
        n,
        k,
        rows.stride(0),
        weight.stride(0),
        out.stride(0),
        scale.shape[1],
        *matrix.block,
        *matrix.phase,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
    )
    return out.reshape(*x.shape[:-1], n)
