"""Fused mixture-of-experts in Triton (the GPU path), after vLLM's ``fused_moe`` design.

A step's (token, slot) pairs are first *aligned*: grouped by expert and padded so that
every ``BLOCK_M`` block of the sorted order holds pairs of one expert only (``align_pairs``,
torch ops with no host synchronisation). Two grouped GEMMs then run over those blocks:

1. ``_gate_up_kernel``: ``hidden[token] @ w13[e]^T`` as two accumulators (the gate rows and
   the up rows), plus bias, and the activation fused: one ``[pairs, I]`` intermediate;
2. ``_down_kernel``: ``intermediate @ w2[e]^T`` plus bias, times the pair's routing weight,
   into a ``[pairs, H]`` fp32 buffer that is summed over the ``k`` slots of each token.

Accumulation is fp32 throughout; pairs whose expert is not on this rank (``expert_map``
gives -1) are in no block, so their rows of the buffer stay zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

ACTIVATIONS = {"silu": 0, "clamped_swiglu": 1}


@dataclass(frozen=True)
class SwigluConstants:
    """The clamped SwiGLU's constants (a config's ``swiglu_alpha``, ``swiglu_limit``);
    the defaults are gpt-oss's: gate <= 7, -7 <= up <= 7, sigmoid(1.702 * gate)."""

    alpha: float = 1.702
    limit: float = 7.0


@dataclass(frozen=True)
class AlignedPairs:
    """Pair indices (``token * k + slot``) in expert-sorted blocks of ``block_m``.

    ``pair_ids`` pads each expert's run with ``num_pairs`` (no pair); ``block_experts`` is
    the local expert of each block, -1 for the trailing blocks no expert needed.
    """

    pair_ids: torch.Tensor  # [num_blocks * block_m] int32
    block_experts: torch.Tensor  # [num_blocks] int32
    block_m: int

    @property
    def num_blocks(self) -> int:
        return self.block_experts.numel()


def align_pairs(local_ids: torch.Tensor, num_experts: int, block_m: int) -> AlignedPairs:
    """Group the flat local expert ids (-1: not on this rank) into padded expert blocks.

    The block count is an upper bound known from the shapes alone (each non-empty expert
    wastes less than one block), so nothing waits on the device.
    """
    num_pairs = local_ids.numel()
    device = local_ids.device
    keys = torch.where(local_ids >= 0, local_ids, num_experts)  # skipped pairs sort last
    sorted_keys, order = torch.sort(keys, stable=True)
    # counted by scatter_add_, not bincount: CUDA's bincount reads the largest key on the
    # host to size its output, a wait no CUDA graph may hold
    counts = torch.zeros(num_experts + 1, dtype=torch.long, device=device)
    counts = counts.scatter_add_(0, keys.long(), torch.ones_like(keys, dtype=torch.long))
    counts = counts[:num_experts]
    blocks_per_expert = (counts + block_m - 1) // block_m
    block_end = torch.cumsum(blocks_per_expert, 0)
    first_slot = (block_end - blocks_per_expert) * block_m
    first_pair = torch.cumsum(counts, 0) - counts
    num_blocks = triton.cdiv(num_pairs, block_m) + min(num_experts, num_pairs)
    capacity = num_blocks * block_m
    expert = sorted_keys.clamp(max=num_experts - 1)
    rank = torch.arange(num_pairs, device=device) - first_pair[expert]
    dest = torch.where(sorted_keys < num_experts, first_slot[expert] + rank, capacity)
    pair_ids = torch.full((capacity + 1,), num_pairs, dtype=torch.int32, device=device)
    pair_ids[dest] = order.to(torch.int32)  # skipped pairs land in the dropped last slot
    blocks = torch.arange(num_blocks, device=device)
    block_experts = torch.searchsorted(block_end, blocks, right=True)
    block_experts = torch.where(block_experts < num_experts, block_experts, -1)
    return AlignedPairs(pair_ids[:capacity], block_experts.to(torch.int32), block_m)


@triton.jit
def _block_rows(pair_ids_ptr, block_experts_ptr, num_pairs, BLOCK_M: tl.constexpr):
    """This block's expert (int64, -1 for none), its pair ids and which of them are real."""
    block = tl.program_id(0)
    expert = tl.load(block_experts_ptr + block).to(tl.int64)
    pairs = tl.load(pair_ids_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    return expert, pairs, pairs < num_pairs


@triton.jit
def _weight_tile(w_ptr, rows, offs_k, mask_rows, mask_k, stride_n, stride_k):
    """A ``[BLOCK_K, BLOCK_N]`` tile of ``w^T`` (rows of w are the output features)."""
    ptrs = w_ptr + rows[None, :] * stride_n + offs_k[:, None] * stride_k
    return tl.load(ptrs, mask=mask_rows[None, :] & mask_k[:, None], other=0.0)


@triton.jit
def _add_bias(acc, bias_ptr, expert, offs_n, mask_n, stride_be, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:
        bias = tl.load(bias_ptr + expert * stride_be + offs_n, mask=mask_n, other=0.0)
        acc += bias.to(tl.float32)[None, :]
    return acc


@triton.jit
def _activate(gate, up, alpha, limit, ACTIVATION: tl.constexpr):
    """0: SiLU(gate) * up; 1: the clamped SwiGLU (gpt-oss's) with ``alpha`` and ``limit``."""
    if ACTIVATION == 0:
        return gate * tl.sigmoid(gate) * up
    gate = tl.minimum(gate, limit)
    up = tl.minimum(tl.maximum(up, -limit), limit)
    return (up + 1.0) * gate * tl.sigmoid(gate * alpha)


@triton.jit(do_not_specialize=["num_pairs"])  # the step's (token, expert) pairs
def _gate_up_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    pair_ids_ptr,
    block_experts_ptr,
    out_ptr,
    num_pairs,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_we,
    stride_wn,
    stride_wk,
    stride_be,
    stride_om,
    swiglu_alpha,
    swiglu_limit,
    TOP_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """out[pair, n] = act(x[token] . w[e, n] + b[e, n], x[token] . w[e, N + n] + b[e, N + n])."""
    expert, pairs, mask_m = _block_rows(pair_ids_ptr, block_experts_ptr, num_pairs, BLOCK_M)
    if expert < 0:
        return
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    rows_x = x_ptr + (pairs // TOP_K)[:, None] * stride_xm
    w_e = w_ptr + expert * stride_we
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        offs_k = start + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        x = tl.load(
            rows_x + offs_k[None, :] * stride_xk, mask=mask_m[:, None] & mask_k[None, :], other=0.0
        )
        w_gate = _weight_tile(w_e, offs_n, offs_k, mask_n, mask_k, stride_wn, stride_wk)
        w_up = _weight_tile(w_e, N + offs_n, offs_k, mask_n, mask_k, stride_wn, stride_wk)
        gate += tl.dot(x, w_gate, input_precision="ieee")  # fp32: no tf32 rounding
        up += tl.dot(x, w_up, input_precision="ieee")
    gate = _add_bias(gate, bias_ptr, expert, offs_n, mask_n, stride_be, HAS_BIAS)
    up = _add_bias(up, bias_ptr + N, expert, offs_n, mask_n, stride_be, HAS_BIAS)
    values = _activate(gate, up, swiglu_alpha, swiglu_limit, ACTIVATION)
    values = values.to(out_ptr.dtype.element_ty)
    out = out_ptr + pairs[:, None] * stride_om + offs_n[None, :]
    tl.store(out, values, mask=mask_m[:, None] & mask_n[None, :])


@triton.jit(do_not_specialize=["num_pairs"])
def _down_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    weights_ptr,
    pair_ids_ptr,
    block_experts_ptr,
    out_ptr,
    num_pairs,
    N,
    K,
    stride_xm,
    stride_we,
    stride_wn,
    stride_wk,
    stride_be,
    stride_om,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """out[pair, n] = routing_weight[pair] * (x[pair] . w[e, n] + b[e, n]), fp32."""
    expert, pairs, mask_m = _block_rows(pair_ids_ptr, block_experts_ptr, num_pairs, BLOCK_M)
    if expert < 0:
        return
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    rows_x = x_ptr + pairs[:, None] * stride_xm
    w_e = w_ptr + expert * stride_we
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        offs_k = start + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        x = tl.load(rows_x + offs_k[None, :], mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        w = _weight_tile(w_e, offs_n, offs_k, mask_n, mask_k, stride_wn, stride_wk)
        acc += tl.dot(x, w, input_precision="ieee")
    acc = _add_bias(acc, bias_ptr, expert, offs_n, mask_n, stride_be, HAS_BIAS)
    routing = tl.load(weights_ptr + pairs, mask=mask_m, other=0.0)
    out = out_ptr + pairs[:, None] * stride_om + offs_n[None, :]
    tl.store(out, acc * routing[:, None], mask=mask_m[:, None] & mask_n[None, :])


@dataclass(frozen=True)
class Tiles:
    block_m: int
    block_n: int
    block_k: int


def choose_tiles(num_pairs: int, num_experts: int) -> Tiles:
    """Small row blocks when few pairs reach each expert (decode), larger ones otherwise."""
    if num_pairs <= 4 * num_experts:
        return Tiles(block_m=16, block_n=64, block_k=64)
    return Tiles(block_m=64, block_n=64, block_k=32)


def _check_shapes(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> None:
    if hidden.dim() != 2 or w13.dim() != 3 or w2.dim() != 3:
        raise ValueError("fused_moe_triton needs hidden [T, H], w13 [E, 2I, H], w2 [E, H, I]")
    num_experts, two_i, size = w13.shape
    if size != hidden.shape[1] or two_i % 2:
        raise ValueError(f"w13 {tuple(w13.shape)} does not match hidden {tuple(hidden.shape)}")
    if w2.shape != (num_experts, size, two_i // 2):
        raise ValueError(f"w2 {tuple(w2.shape)} does not match w13 {tuple(w13.shape)}")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != hidden.shape[0]:
        raise ValueError(f"topk_ids {tuple(topk_ids.shape)} is not [T, k] for T={len(hidden)}")
    if topk_weights.shape != topk_ids.shape:
        raise ValueError("topk_weights and topk_ids differ in shape")
    if not w13.dtype == w2.dtype == hidden.dtype:
        raise ValueError(
            f"hidden, w13, w2 differ in dtype: {hidden.dtype}, {w13.dtype}, {w2.dtype}"
        )


def _check_bias(bias: torch.Tensor | None, shape: tuple[int, int], name: str) -> None:
    if bias is not None and tuple(bias.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(bias.shape)}, expected {shape}")


def _local_ids(topk_ids: torch.Tensor, expert_map: torch.Tensor | None) -> torch.Tensor:
    """Flat local expert index of every pair, -1 where the expert is on another rank."""
    flat = topk_ids.reshape(-1).long()
    if expert_map is None:
        return flat
    return expert_map.to(device=flat.device, dtype=torch.long)[flat]


def _gate_up(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    bias: torch.Tensor | None,
    aligned: AlignedPairs,
    top_k: int,
    activation: int,
    swiglu: SwigluConstants,
    tiles: Tiles,
) -> torch.Tensor:
    num_pairs = hidden.shape[0] * top_k
    inter = w13.shape[1] // 2
    out = torch.empty(num_pairs, inter, dtype=hidden.dtype, device=hidden.device)
    grid = (aligned.num_blocks, triton.cdiv(inter, tiles.block_n))
    _gate_up_kernel[grid](
        hidden,
        w13,
        w13 if bias is None else bias,
        aligned.pair_ids,
        aligned.block_experts,
        out,
        num_pairs,
        inter,
        hidden.shape[1],
        hidden.stride(0),
        hidden.stride(1),
        *w13.stride(),
        0 if bias is None else bias.stride(0),
        out.stride(0),
        float(swiglu.alpha),
        float(swiglu.limit),
        TOP_K=top_k,
        HAS_BIAS=bias is not None,
        ACTIVATION=activation,
        BLOCK_M=aligned.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k,
    )
    return out


def _down(
    inter: torch.Tensor,
    w2: torch.Tensor,
    bias: torch.Tensor | None,
    routing: torch.Tensor,
    aligned: AlignedPairs,
    tiles: Tiles,
) -> torch.Tensor:
    num_pairs, size = inter.shape[0], w2.shape[1]
    out = torch.zeros(num_pairs, size, dtype=torch.float32, device=inter.device)
    grid = (aligned.num_blocks, triton.cdiv(size, tiles.block_n))
    _down_kernel[grid](
        inter,
        w2,
        w2 if bias is None else bias,
        routing,
        aligned.pair_ids,
        aligned.block_experts,
        out,
        num_pairs,
        size,
        w2.shape[2],
        inter.stride(0),
        *w2.stride(),
        0 if bias is None else bias.stride(0),
        out.stride(0),
        HAS_BIAS=bias is not None,
        BLOCK_M=aligned.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k,
    )
    return out


def fused_moe_triton(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    expert_map: torch.Tensor | None = None,
    swiglu: SwigluConstants | None = None,
) -> torch.Tensor:
    """``sum_j topk_weights[t, j] * expert_{topk_ids[t, j]}(hidden[t])`` for every token.

    An expert is ``w2 @ act(w13 @ x + b13) + b2`` with w13's first ``I`` rows the gate and
    the next ``I`` the up projection. ``expert_map`` maps global expert ids to this rank's
    index into w13/w2 (-1: elsewhere; such pairs add nothing). ``swiglu``: the clamped
    SwiGLU's constants (default gpt-oss's). Returns hidden's dtype.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown MoE activation {activation!r}; known: {sorted(ACTIVATIONS)}")
    _check_shapes(hidden, w13, w2, topk_weights, topk_ids)
    num_experts, two_i, size = w13.shape
    _check_bias(w13_bias, (num_experts, two_i), "w13_bias")
    _check_bias(w2_bias, (num_experts, size), "w2_bias")
    num_tokens, top_k = topk_ids.shape
    if num_tokens == 0:
        return torch.zeros_like(hidden)
    tiles = choose_tiles(num_tokens * top_k, num_experts)
    aligned = align_pairs(_local_ids(topk_ids, expert_map), num_experts, tiles.block_m)
    routing = topk_weights.reshape(-1).to(torch.float32).contiguous()
    w13_bias, w2_bias = (b if b is None else b.contiguous() for b in (w13_bias, w2_bias))
    kind, swiglu = ACTIVATIONS[activation], swiglu or SwigluConstants()
    inter = _gate_up(hidden, w13, w13_bias, aligned, top_k, kind, swiglu, tiles)
    pairs = _down(inter, w2, w2_bias, routing, aligned, tiles)
    return pairs.view(num_tokens, top_k, size).sum(dim=1).to(hidden.dtype)
