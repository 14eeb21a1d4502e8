"""Multi-LoRA deltas in Triton (the GPU path), checked against ``LoRALinear``'s torch path.

Punica/S-LoRA's two steps, each one launch for every row and slice of a layer; each row
reads the adapter of its own slot (``row_slots``, int32, ``-1``: no adapter):

- ``lora_shrink``: ``shrunk[j, i] = x[i] @ A[slot_i, j].T`` (fp32, ``[slices, rows, rank]``);
- ``lora_expand``: ``out[i, off_j : off_j + size_j] += shrunk[j, i] @ B[slot_i, off_j:...].T``,
  rows without an adapter left untouched.

Rows of one tile may use different slots, so the weights are gathered per row into a
``[BLOCK_M, BLOCK_N, BLOCK_K]`` tile and reduced in registers (no ``tl.dot``): the ranks are
small and the step is bound by reading A and B. Accumulation is fp32.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

BLOCK_M = 16  # rows per program
BLOCK_R = 16  # rank columns per program (shrink) and per step of the expand reduction
BLOCK_K = 32  # input features per step of the shrink reduction
BLOCK_N = 32  # output features per program (expand)


@triton.jit
def _row_tile(slot_ptr, M, BLOCK_M: tl.constexpr):
    """This program's rows, which of them exist, their slots and which have an adapter."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    slot = tl.load(slot_ptr + offs_m, mask=mask_m, other=-1).to(tl.int64)
    return offs_m.to(tl.int64), mask_m, slot, mask_m & (slot >= 0)


@triton.jit(do_not_specialize=["M"])  # the step's token count: one compile for all
def _shrink_kernel(
    x_ptr,
    a_ptr,
    slot_ptr,
    out_ptr,
    M,
    R,
    K,
    stride_xm,
    stride_al,
    stride_as,
    stride_ar,
    stride_os,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    offs_m, mask_m, slot, has = _row_tile(slot_ptr, M, BLOCK_M)
    offs_r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    mask_r = offs_r < R
    piece = tl.program_id(2).to(tl.int64)
    a_rows = a_ptr + slot[:, None] * stride_al + piece * stride_as + offs_r[None, :] * stride_ar
    mask_a = has[:, None, None] & mask_r[None, :, None]
    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        offs_k = start + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
            mask=has[:, None] & mask_k[None, :],
            other=0.0,
        )
        a = tl.load(
            a_rows[:, :, None] + offs_k[None, None, :],
            mask=mask_a & mask_k[None, None, :],
            other=0.0,
        )
        acc += tl.sum(x.to(tl.float32)[:, None, :] * a.to(tl.float32), axis=2)
    out = out_ptr + piece * stride_os + offs_m[:, None] * stride_om + offs_r[None, :]
    tl.store(out, acc, mask=mask_m[:, None] & mask_r[None, :])


@triton.jit(do_not_specialize=["M"])
def _expand_kernel(
    s_ptr,
    b_ptr,
    slot_ptr,
    table_ptr,
    out_ptr,
    M,
    R,
    num_slices,
    stride_ss,
    stride_sm,
    stride_bl,
    stride_bn,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    offs_m, _, slot, has = _row_tile(slot_ptr, M, BLOCK_M)
    piece = tl.program_id(2)
    offset = tl.load(table_ptr + piece)
    size = tl.load(table_ptr + num_slices + piece)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < size
    cols = (offset + offs_n).to(tl.int64)
    b_rows = b_ptr + slot[:, None] * stride_bl + cols[None, :] * stride_bn
    mask_b = has[:, None, None] & mask_n[None, :, None]
    s_rows = s_ptr + piece.to(tl.int64) * stride_ss + offs_m * stride_sm
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, R, BLOCK_R):
        offs_r = start + tl.arange(0, BLOCK_R)
        mask_r = offs_r < R
        s = tl.load(
            s_rows[:, None] + offs_r[None, :], mask=has[:, None] & mask_r[None, :], other=0.0
        )
        b = tl.load(
            b_rows[:, :, None] + offs_r[None, None, :],
            mask=mask_b & mask_r[None, None, :],
            other=0.0,
        )
        acc += tl.sum(s[:, None, :] * b.to(tl.float32), axis=2)
    out = out_ptr + offs_m[:, None] * stride_om + cols[None, :]
    mask = has[:, None] & mask_n[None, :]
    base = tl.load(out, mask=mask, other=0.0)
    tl.store(out, (base.to(tl.float32) + acc).to(out_ptr.dtype.element_ty), mask=mask)


def lora_shrink(x: torch.Tensor, lora_a: torch.Tensor, row_slots: torch.Tensor) -> torch.Tensor:
    """``[slices, rows, max_rank]`` fp32: each row times its slot's A of every slice."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    rows, k = x.shape
    _, slices, rank, _ = lora_a.shape
    out = torch.empty(slices, rows, rank, dtype=torch.float32, device=x.device)
    if rows == 0:
        return out
    a = lora_a.contiguous()
    grid = (triton.cdiv(rows, BLOCK_M), triton.cdiv(rank, BLOCK_R), slices)
    _shrink_kernel[grid](
        x,
        a,
        row_slots,
        out,
        rows,
        rank,
        k,
        x.stride(0),
        a.stride(0),
        a.stride(1),
        a.stride(2),
        out.stride(0),
        out.stride(1),
        BLOCK_M=BLOCK_M,
        BLOCK_R=BLOCK_R,
        BLOCK_K=BLOCK_K,
    )
    return out


def lora_expand(
    out: torch.Tensor,
    shrunk: torch.Tensor,
    lora_b: torch.Tensor,
    row_slots: torch.Tensor,
    slice_offsets: tuple[int, ...],
    slice_sizes: tuple[int, ...],
) -> torch.Tensor:
    """Add each row's ``shrunk @ B.T`` to its slice's columns of ``out`` (in place)."""
    if out.stride(-1) != 1:
        raise ValueError("lora_expand writes in place: out's rows must be contiguous")
    rows = out.shape[0]
    if rows == 0:
        return out
    slices, _, rank = shrunk.shape
    shrunk, b = shrunk.contiguous(), lora_b.contiguous()
    table = _slice_table(tuple(slice_offsets), tuple(slice_sizes), out.device)
    grid = (triton.cdiv(rows, BLOCK_M), triton.cdiv(max(slice_sizes), BLOCK_N), slices)
    _expand_kernel[grid](
        shrunk,
        b,
        row_slots,
        table,
        out,
        rows,
        rank,
        slices,
        shrunk.stride(0),
        shrunk.stride(1),
        b.stride(0),
        b.stride(1),
        out.stride(0),
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        BLOCK_R=BLOCK_R,
    )
    return out


@functools.cache
def _slice_table(
    offsets: tuple[int, ...], sizes: tuple[int, ...], device: torch.device
) -> torch.Tensor:
    """The slices' offsets then sizes, int32 on ``device`` (made once per layer shape)."""
    return torch.tensor(offsets + sizes, dtype=torch.int32, device=device)
