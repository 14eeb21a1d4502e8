"""Paged attention in Triton: the GPU path, checked against ``torch_ops``.

The KV cache of one layer is one tensor ``[2, num_blocks, block_size, num_kv_heads,
head_dim]`` (index 0 keys, 1 values). Kernels find a token's keys/values through the block
table one token at a time (``block_table[pos // block_size]``), so a tile of ``BLOCK_N``
tokens may span several cache blocks and the tile shape does not depend on the block size.
Softmax and accumulation run in fp32 with ``exp2``; the prefill matmuls take fp16/bf16
operands for half models (fp32 otherwise); outputs take the query's dtype.

An fp8 cache (``kv_quant``) is read and written as its bytes, converted with integer bit
operations: the same rounding as torch on every GPU and under the interpreter (whose own
fp8 casts round wrongly), and no fp8 instructions needed (pre-Hopper GPUs lack them).
Stored E4M3 bytes widen to fp16 as ``value / 256`` (E5M2 to ``value``, exactly): that
factor and ``k_scale`` go into the softmax scale, ``v_scale`` into the output.

Triton compiles a kernel again for each new specialisation of its arguments: an integer
equal to 1 or divisible by 16, a pointer aligned to 16 bytes. A step's batch changes the
block table's width and the offsets of the slices the kernels get (``seq_lens``, the
slot mapping, the decode rows' tables): those arguments are declared not specialised
(``do_not_specialize``, ``do_not_specialize_on_alignment``), so a new batch never compiles
a kernel mid-serving (on an H200 each compile stalled the engine for a fraction of a
second). What stays specialised is fixed for a model (its strides, head size, options).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from octavo.attention.kv_quant import UNIT_SCALES, KVScales
from octavo.attention.options import FULL_ATTENTION, AttentionOptions
from octavo.kernels.triton_fp8_bits import (
    FP8_FORMATS,
    FP8_HALF_FACTOR,
    NOT_FP8,
    fp8_encode,
    fp8_to_half,
)

LOG2E = 1.4426950408889634
_LOG2E = tl.constexpr(LOG2E)


@triton.jit
def _load_kv(ptrs, mask, FP8: tl.constexpr, DTYPE: tl.constexpr):
    """A key/value tile as stored, in ``DTYPE`` (fp8: widened through fp16, see
    ``FP8_HALF_FACTOR``). Both branches return ``DTYPE``: compiled Triton requires it."""
    if FP8 == 0:
        return tl.load(ptrs, mask=mask, other=0.0).to(DTYPE)
    return fp8_to_half(tl.load(ptrs, mask=mask, other=0), FP8).to(DTYPE)


@dataclass(frozen=True)
class CacheFormat:
    """How the kernels see one cache: the tensor they index, its fp8 format, and the
    factors that turn what they load into keys and values."""

    tensor: torch.Tensor
    fp8: int
    k_factor: float
    v_factor: float


def cache_format(kv_cache: torch.Tensor, scales: KVScales) -> CacheFormat:
    fp8 = FP8_FORMATS.get(kv_cache.dtype, NOT_FP8)
    if fp8 == NOT_FP8:
        if scales != UNIT_SCALES:
            raise ValueError("k_scale / v_scale other than 1 need an fp8 cache")
        return CacheFormat(kv_cache, fp8, 1.0, 1.0)
    factor = FP8_HALF_FACTOR[fp8]
    return CacheFormat(kv_cache.view(torch.uint8), fp8, scales.k * factor, scales.v * factor)


@triton.jit
def _store_kv_kernel(
    key_ptr,
    value_ptr,
    cache_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kv,
    stride_blk,
    stride_tok,
    stride_ch,
    num_kv_heads,
    head_dim,
    inv_k_scale,
    inv_v_scale,
    BLOCK_SIZE: tl.constexpr,
    HEADS_P2: tl.constexpr,
    DIM_P2: tl.constexpr,
    FP8: tl.constexpr,
):
    """Copy token ``program_id(0)``'s key/value ``[kv_heads, head_dim]`` into its slot
    (an fp8 cache: ``key * inv_k_scale`` as fp8 bytes, values alike)."""
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    offs_h = tl.arange(0, HEADS_P2)
    offs_d = tl.arange(0, DIM_P2)
    mask = (offs_h[:, None] < num_kv_heads) & (offs_d[None, :] < head_dim) & (slot >= 0)
    key = tl.load(key_ptr + token * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask)
    value = tl.load(
        value_ptr + token * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask
    )
    row = (slot // BLOCK_SIZE) * stride_blk + (slot % BLOCK_SIZE) * stride_tok
    dst = cache_ptr + row + offs_h[:, None] * stride_ch + offs_d[None, :]
    if FP8 == 0:
        tl.store(dst, key.to(cache_ptr.dtype.element_ty), mask)
        tl.store(dst + stride_kv, value.to(cache_ptr.dtype.element_ty), mask)
    else:
        tl.store(dst, fp8_encode(key.to(tl.float32) * inv_k_scale, FP8), mask)
        tl.store(dst + stride_kv, fp8_encode(value.to(tl.float32) * inv_v_scale, FP8), mask)


@triton.jit
def _kv_tile_ptrs(
    cache_ptr,
    table_ptr,
    offs_n,
    mask_n,
    offs_d,
    kv_head,
    stride_blk,
    stride_tok,
    stride_ch,
    BLOCK_SIZE: tl.constexpr,
):
    """Pointers ``[BLOCK_N, DIM_P2]`` to the keys of context positions ``offs_n``."""
    block_ids = tl.load(table_ptr + offs_n // BLOCK_SIZE, mask=mask_n, other=0).to(tl.int64)
    rows = block_ids * stride_blk + (offs_n % BLOCK_SIZE) * stride_tok + kv_head * stride_ch
    return cache_ptr + rows[:, None] + offs_d[None, :]


@triton.jit
def _online_softmax(scores, m_i, l_i):
    """One online-softmax step over ``scores [M, N]`` (log2 domain, masked = -inf).

    Returns the unnormalised probabilities, the rescale factor for the running
    accumulator, and the new running max and denominator.
    """
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(scores - m_new[:, None])
    l_new = l_i * alpha + tl.sum(p, axis=1)
    return p, alpha, m_new, l_new


@triton.jit
def _softmax_init(sinks_ptr, heads, mask, ROWS: tl.constexpr, SINKS: tl.constexpr):
    """Running max and denominator before the first key: empty, or each row's sink logit
    (log2 domain) already counted once, so the sink joins the denominator and nothing else."""
    if SINKS:
        m_i = tl.load(sinks_ptr + heads, mask=mask, other=0.0).to(tl.float32) * _LOG2E
        l_i = tl.full([ROWS], 1.0, tl.float32)
    else:
        m_i = tl.full([ROWS], -1.0e30, tl.float32)
        l_i = tl.zeros([ROWS], tl.float32)
    return m_i, l_i


@triton.jit
def _soft_cap(scores, cap):
    """``cap * tanh(scores / cap)``, with ``tanh(x) = 2 sigmoid(2x) - 1`` (no tanh in the
    interpreter's ``tl``). The log2 domain commutes: pass ``cap * LOG2E`` for log2 scores."""
    return cap * (2.0 * tl.sigmoid(scores * (2.0 / cap)) - 1.0)


@triton.jit
def _first_visible(pos, window, chunk, WINDOW: tl.constexpr, CHUNK: tl.constexpr):
    """The first key position the query at ``pos`` sees: 0, its window's first or its
    attention chunk's first (``floor(pos / chunk) * chunk``), whichever is latest."""
    first = pos * 0
    if WINDOW:
        first = tl.maximum(pos - window + 1, 0)
    if CHUNK:
        first = tl.maximum(first, pos // chunk * chunk)
    return first


@triton.jit(
    do_not_specialize=["stride_tb"],
    do_not_specialize_on_alignment=["q_ptr", "table_ptr", "qsl_ptr", "seq_lens_ptr", "out_ptr"],
)
def _prefill_kernel(
    q_ptr,
    cache_ptr,
    table_ptr,
    qsl_ptr,
    seq_lens_ptr,
    out_ptr,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_tb,
    stride_kv,
    stride_blk,
    stride_tok,
    stride_ch,
    qk_scale,
    v_factor,
    head_dim,
    window,
    soft_cap,
    sinks_ptr,
    chunk,
    GROUP: tl.constexpr,
    DIM_P2: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
    FP8: tl.constexpr,
    WINDOW: tl.constexpr,
    SOFT_CAP: tl.constexpr,
    SINKS: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """Program ``(chunk, query tile, head)``: ``BLOCK_M`` queries of one prefill chunk.

    The two matmuls take ``DOT_DTYPE`` operands and accumulate in fp32; ``PRECISION`` is
    "ieee" for fp32 operands so they are not rounded to TF32. The options are those of
    ``triton_decode._decode_kernel``; with a window or an attention chunk (``CHUNK``: each
    query sees keys from ``floor(pos / chunk) * chunk`` on) the loop starts at the tile
    holding the first key the tile's earliest query sees.
    """
    seq = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1)
    head = tl.program_id(2)
    q_start = tl.load(qsl_ptr + seq)
    q_len = tl.load(qsl_ptr + seq + 1) - q_start
    if tile * BLOCK_M >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, DIM_P2)
    q_pos = seq_len - q_len + offs_m  # context position of each query
    mask_q = (offs_m[:, None] < q_len) & (offs_d[None, :] < head_dim)
    rows = (q_start + offs_m).to(tl.int64)
    q_ptrs = q_ptr + rows[:, None] * stride_qt + head * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=mask_q, other=0.0).to(DOT_DTYPE)
    heads = tl.full([BLOCK_M], head, tl.int32)
    m_i, l_i = _softmax_init(sinks_ptr, heads, offs_m >= 0, BLOCK_M, SINKS)
    acc = tl.zeros([BLOCK_M, DIM_P2], tl.float32)
    kv_end = tl.minimum(seq_len, seq_len - q_len + (tile + 1) * BLOCK_M)  # causal horizon
    first = _first_visible(seq_len - q_len + tile * BLOCK_M, window, chunk, WINDOW, CHUNK)
    for start in range(first // BLOCK_N * BLOCK_N, kv_end, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        mask_n = offs_n < kv_end
        if WINDOW or CHUNK:
            mask_n = mask_n & (offs_n >= first)
        ptrs = _kv_tile_ptrs(
            cache_ptr,
            table_ptr + seq * stride_tb,
            offs_n,
            mask_n,
            offs_d,
            head // GROUP,
            stride_blk,
            stride_tok,
            stride_ch,
            BLOCK_SIZE,
        )
        mask_kv = mask_n[:, None] & (offs_d[None, :] < head_dim)
        k = _load_kv(ptrs, mask_kv, FP8, DOT_DTYPE)
        v = _load_kv(ptrs + stride_kv, mask_kv, FP8, DOT_DTYPE)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        if SOFT_CAP:
            scores = _soft_cap(scores, soft_cap)
        visible = mask_n[None, :] & (offs_n[None, :] <= q_pos[:, None])
        if WINDOW:
            visible = visible & (offs_n[None, :] > q_pos[:, None] - window)
        if CHUNK:
            visible = visible & (offs_n[None, :] >= (q_pos // chunk * chunk)[:, None])
        scores = tl.where(visible, scores, float("-inf"))
        p, alpha, m_i, l_i = _online_softmax(scores, m_i, l_i)
        pv = tl.dot(p.to(DOT_DTYPE), v, input_precision=PRECISION)
        acc = acc * alpha[:, None] + pv
    out = acc * (v_factor / tl.where(l_i > 0, l_i, 1.0))[:, None]
    o_ptrs = out_ptr + rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :]
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask_q)


def _last_dim_contiguous(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor itself when its last dimension is dense, else a contiguous copy."""
    return tensor if tensor.stride(-1) == 1 else tensor.contiguous()


def _cache_strides(kv_cache: torch.Tensor) -> tuple[int, int, int, int]:
    """Strides (kv, block, token, kv head) of a cache whose head_dim is contiguous."""
    if kv_cache.stride(-1) != 1:
        raise ValueError("kv_cache must be contiguous along head_dim")
    return kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3)


def _prefill_kv_tile(block_size: int) -> int:
    """Context tokens per prefill loop step: at least 16 (tensor-core minimum), at most 64."""
    return max(16, min(64, triton.next_power_of_2(block_size)))


def kernel_options(options: AttentionOptions, query: torch.Tensor) -> dict[str, object]:
    """The attention kernels' option arguments: runtime values and the constexpr flags that
    compile each feature in (all off for plain attention: the kernel without options).

    ``query [T, heads, head_dim]`` gives the head count the sinks must match and their device.
    """
    window, soft_cap, sinks = options.sliding_window, options.soft_cap, options.sinks
    chunk = options.chunk_size
    if window is not None and window < 1:
        raise ValueError(f"sliding_window must be at least 1, got {window}")
    if chunk is not None and chunk < 1:
        raise ValueError(f"chunk_size must be at least 1, got {chunk}")
    if soft_cap is not None and not soft_cap > 0:
        raise ValueError(f"soft_cap must be positive, got {soft_cap}")
    if sinks is not None:
        if sinks.shape != (query.shape[1],):
            raise ValueError(f"sinks must be [{query.shape[1]}] (one per head), got {sinks.shape}")
        sinks = sinks.to(device=query.device, dtype=torch.float32).contiguous()
    return {
        "window": window or 0,
        "soft_cap": (soft_cap or 1.0) * LOG2E,  # the kernels' scores are in the log2 domain
        "sinks_ptr": sinks,
        "chunk": chunk or 1,
        "WINDOW": window is not None,
        "SOFT_CAP": soft_cap is not None,
        "SINKS": sinks is not None,
        "CHUNK": chunk is not None,
    }


def _dot_dtype(query: torch.Tensor) -> tl.dtype:
    """Operand dtype of the prefill ``tl.dot``s: the model's half type, fp32 otherwise.

    bf16 stays fp32 off CUDA: the Triton interpreter cannot multiply bf16 matrices.
    """
    if query.dtype == torch.float16:
        return tl.float16
    if query.dtype == torch.bfloat16 and query.is_cuda:
        return tl.bfloat16
    return tl.float32


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    scales: KVScales = UNIT_SCALES,
) -> None:
    """Write each token's key/value ``[T, kv_heads, head_dim]`` into its cache slot
    (an fp8 cache: ``kv_quant.quantize`` of them, bit for bit).

    Tokens whose slot is negative are skipped.
    """
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    key, value = _last_dim_contiguous(key), _last_dim_contiguous(value)
    cache = cache_format(kv_cache, scales)
    stride_kv, stride_blk, stride_tok, stride_ch = _cache_strides(cache.tensor)
    _store_kv_kernel[(num_tokens,)](
        key,
        value,
        cache.tensor,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        stride_kv,
        stride_blk,
        stride_tok,
        stride_ch,
        num_kv_heads,
        head_dim,
        1.0 / scales.k,
        1.0 / scales.v,
        BLOCK_SIZE=kv_cache.shape[2],
        HEADS_P2=triton.next_power_of_2(num_kv_heads),
        DIM_P2=triton.next_power_of_2(head_dim),
        FP8=cache.fp8,
    )


def prefill_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    max_query_len: int,
    scale: float,
    out: torch.Tensor | None = None,
    scales: KVScales = UNIT_SCALES,
    options: AttentionOptions = FULL_ATTENTION,
    kv_tile: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Causal attention of several prefill chunks over their cached prefixes and themselves.

    Chunk ``i`` is ``query[query_start_loc[i]:query_start_loc[i + 1]]``: the last tokens of
    a context of ``seq_lens[i]`` tokens whose keys/values are all in the cache already.
    ``options``: the layer's window, soft-cap and sinks (``AttentionOptions``).
    ``kv_tile`` (context tokens per loop step, a power of two of at least 16) and
    ``num_warps`` override the launch (the GPU bench's sweep; default: ``_prefill_kv_tile``
    and Triton's).
    """
    query = _last_dim_contiguous(query)
    num_heads, head_dim = query.shape[1], query.shape[2]
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device) if out is None else out
    num_chunks = seq_lens.shape[0]
    if num_chunks == 0 or max_query_len == 0:
        return out
    extra = kernel_options(options, query)
    block_m = max(16, min(64, triton.next_power_of_2(max_query_len)))
    dot_dtype = _dot_dtype(query)
    cache = cache_format(kv_cache, scales)
    stride_kv, stride_blk, stride_tok, stride_ch = _cache_strides(cache.tensor)
    grid = (num_chunks, triton.cdiv(max_query_len, block_m), num_heads)
    launch = {} if num_warps is None else {"num_warps": num_warps}
    _prefill_kernel[grid](
        query,
        cache.tensor,
        block_tables,
        query_start_loc,
        seq_lens,
        out,
        query.stride(0),
        query.stride(1),
        out.stride(0),
        out.stride(1),
        block_tables.stride(0),
        stride_kv,
        stride_blk,
        stride_tok,
        stride_ch,
        scale * LOG2E * cache.k_factor,
        cache.v_factor,
        head_dim,
        GROUP=num_heads // kv_cache.shape[3],
        DIM_P2=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=kv_cache.shape[2],
        BLOCK_M=block_m,
        BLOCK_N=kv_tile or _prefill_kv_tile(kv_cache.shape[2]),
        DOT_DTYPE=dot_dtype,
        PRECISION="ieee" if dot_dtype == tl.float32 else "tf32",
        FP8=cache.fp8,
        **extra,
        **launch,
    )
    return out
