"""Dequantizing GEMMs in Triton (the GPU path), checked against the torch dequantization.

Both kernels compute ``out[m, n] = sum_k x[m, k] * w[n, k]`` over ``BLOCK_M x BLOCK_N``
output tiles, reading the weights in their stored width and widening a ``BLOCK_K`` slice
to the activations' dtype in registers just before ``tl.dot`` (fp32 accumulation):

- ``int4_matmul``: nibbles (``Int4Planes``: byte ``k // 2``, low nibble for even ``k``)
  times a per-32-column scale plus offset;
- ``fp8_matmul``: e4m3 weights, one fp32 scale per output row applied after the sum.

The e4m3 weights are read as their bytes and widened with integer operations
(``kernels/triton_fp8_bits.py``: to fp16 as ``value / 256``, exactly; the 256 joins the
scale), so they run on GPUs without fp8 instructions too (A100, A10).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from octavo.kernels.triton_fp8_bits import E4M3_CODE, E4M3_HALF_FACTOR, fp8_to_half

GROUP = tl.constexpr(32)  # columns per scale/offset pair in Int4Planes (constexpr: read by kernels)


@triton.jit
def _output_tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's output rows and columns, and which of them exist."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    return offs_m, offs_n, offs_m < M, offs_n < N


@triton.jit
def _store_tile(out_ptr, values, offs_m, offs_n, mask_m, mask_n, stride_om):
    out = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(out, values.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit(do_not_specialize=["M"])  # the step's token count: one compile for all
def _int4_matmul_kernel(
    x_ptr,
    packed_ptr,
    scale_ptr,
    offset_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    offs_m, offs_n, mask_m, mask_n = _output_tile(M, N, BLOCK_M, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        offs_k = start + tl.arange(0, BLOCK_K)
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=mask_m[:, None], other=0.0
        )
        column = offs_n[None, :]  # a [BLOCK_K, BLOCK_N] tile of w^T
        byte = tl.load(
            packed_ptr + column * (K // 2) + offs_k[:, None] // 2, mask=mask_n[None, :], other=0
        )
        q = (byte >> ((offs_k[:, None] % 2) * 4)) & 0xF
        group = column * (K // GROUP) + offs_k[:, None] // GROUP
        scale = tl.load(scale_ptr + group, mask=mask_n[None, :], other=0.0)
        offset = tl.load(offset_ptr + group, mask=mask_n[None, :], other=0.0)
        w = q.to(tl.float32) * scale + offset
        acc += tl.dot(x, w.to(x.dtype), input_precision="ieee")  # fp32: no tf32 rounding
    _store_tile(out_ptr, acc, offs_m, offs_n, mask_m, mask_n, stride_om)


@triton.jit(do_not_specialize=["M"])
def _fp8_matmul_kernel(
    x_ptr,
    w_ptr,
    scale_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    offs_m, offs_n, mask_m, mask_n = _output_tile(M, N, BLOCK_M, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        offs_k = start + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
            mask=mask_m[:, None] & mask_k[None, :],
            other=0.0,
        )
        w = tl.load(
            w_ptr + offs_n[None, :] * K + offs_k[:, None],
            mask=mask_n[None, :] & mask_k[:, None],
            other=0,
        )
        w = fp8_to_half(w, E4M3_CODE).to(x.dtype)  # value / 256
        acc += tl.dot(x, w, input_precision="ieee")  # fp32: no tf32 rounding
    scale = tl.load(scale_ptr + offs_n, mask=mask_n, other=0.0) * E4M3_HALF_FACTOR
    _store_tile(out_ptr, acc * scale[None, :], offs_m, offs_n, mask_m, mask_n, stride_om)


def _tiles(rows: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K): small M tiles for decode-sized batches."""
    return (16 if rows <= 16 else 64), 64, 64


def int4_matmul(
    x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor
) -> torch.Tensor:
    rows, k = x.shape
    n = packed.shape[0]
    if k % 64:
        raise ValueError(f"int4_matmul needs input features in multiples of 64, got {k}")
    out = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    block_m, block_n, block_k = _tiles(rows)
    grid = (triton.cdiv(rows, block_m), triton.cdiv(n, block_n))
    _int4_matmul_kernel[grid](
        x,
        packed,
        scales,
        offsets,
        out,
        rows,
        n,
        k,
        x.stride(0),
        out.stride(0),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
    )
    return out


def fp8_matmul(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    rows, k = x.shape
    n = weight.shape[0]
    out = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    block_m, block_n, block_k = _tiles(rows)
    grid = (triton.cdiv(rows, block_m), triton.cdiv(n, block_n))
    _fp8_matmul_kernel[grid](
        x,
        weight.view(torch.uint8),
        scale,
        out,
        rows,
        n,
        k,
        x.stride(0),
        out.stride(0),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
    )
    return out
