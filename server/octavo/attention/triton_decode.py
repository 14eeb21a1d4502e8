"""Paged decode attention in Triton: one new token per sequence over its cached context.

Two kernels, picked by ``choose_num_splits`` from the launch's shape alone:

* single pass: one program per ``(sequence, kv head)`` loops over the whole context;
* split KV ("flash-decoding"): programs ``(sequence, kv head, split)`` each take one
  contiguous chunk of the context and write a partial (running max, denominator and
  unnormalised accumulator) to a workspace; ``_merge_kernel`` combines a row's partials
  with log-sum-exp weights.

Both are CUDA-graph safe: each program reads its sequence's length from ``seq_lens`` on
the device and derives its chunk from it, and the host decides the grid from what is fixed
for a captured batch (rows, kv heads, the block table's width, the GPU's SM count), never
from the per-step lengths. Cache layout, fp8 decoding and options: see ``triton_kernels``.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from octavo.attention.kv_quant import UNIT_SCALES, KVScales
from octavo.attention.options import FULL_ATTENTION, AttentionOptions
from octavo.attention.triton_kernels import (
    LOG2E,
    CacheFormat,
    _cache_strides,
    _dot_dtype,
    _first_visible,
    _kv_tile_ptrs,
    _last_dim_contiguous,
    _load_kv,
    _online_softmax,
    _soft_cap,
    _softmax_init,
    cache_format,
    kernel_options,
)

_LOG2E = tl.constexpr(LOG2E)
SPLIT_KV_TILE = 64  # context tokens per split-kernel loop step (a multiple of block_size)
MIN_SPLIT_TOKENS = 64  # a split reads at least one such tile of the longest context
MIN_DOT_TILE = 16  # the fewest rows a tensor-core tl.dot takes
MAX_SPLITS = 32
PROGRAMS_PER_SM = 8  # programs per SM the split count aims for (see choose_num_splits)
# Launch of the split kernel. H200, bf16, 32 seqs x 2k, 5 splits: 2 warps 0.135 ms (1985
# GB/s), 4 warps 0.171 ms, 8 warps slower; num_stages 1 to 4 made no difference (the
# loads' addresses come from the block table: Triton does not pipeline them).
SPLIT_NUM_STAGES = 2
SPLIT_NUM_WARPS: int | None = None  # None: ``_split_warps``; the bench sets it to compare
# Pointers whose alignment changes with the batch (slices of the step's packed inputs and
# of the workspace): not specialised, so a new batch compiles nothing (``triton_kernels``)
PER_STEP_SPLIT_POINTERS = ["q_ptr", "table_ptr", "seq_lens_ptr", "acc_ptr", "max_ptr", "sum_ptr"]


@triton.jit(
    do_not_specialize=["stride_tb"],
    do_not_specialize_on_alignment=["q_ptr", "table_ptr", "seq_lens_ptr", "out_ptr"],
)
def _decode_kernel(
    q_ptr,
    cache_ptr,
    table_ptr,
    seq_lens_ptr,
    out_ptr,
    stride_qb,
    stride_qh,
    stride_ob,
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
    GROUP_P2: tl.constexpr,
    DIM_P2: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    FP8: tl.constexpr,
    WINDOW: tl.constexpr,
    SOFT_CAP: tl.constexpr,
    SINKS: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """Single pass, program ``(seq, kv_head)``: the ``GROUP`` query heads sharing one kv head.

    ``WINDOW``: only the last ``window`` positions are visible and the loop starts at the
    tile holding the first of them; ``CHUNK``: likewise from the start of the new token's
    attention chunk (``floor(pos / chunk) * chunk``). ``SOFT_CAP``: scores become
    ``soft_cap * tanh(s / soft_cap)`` (``soft_cap`` in the log2 domain). ``SINKS``: each
    head's sink logit starts the softmax's running max and denominator.
    """
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + seq)
    offs_g = tl.arange(0, GROUP_P2)
    offs_d = tl.arange(0, DIM_P2)
    heads = kv_head * GROUP + offs_g
    mask_q = (offs_g[:, None] < GROUP) & (offs_d[None, :] < head_dim)
    q_ptrs = q_ptr + seq * stride_qb + heads[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=mask_q, other=0.0).to(tl.float32) * qk_scale
    m_i, l_i = _softmax_init(sinks_ptr, heads, offs_g < GROUP, GROUP_P2, SINKS)
    acc = tl.zeros([GROUP_P2, DIM_P2], tl.float32)
    first = _first_visible(seq_len - 1, window, chunk, WINDOW, CHUNK)
    for start in range(first // BLOCK_N * BLOCK_N, seq_len, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        mask_n = offs_n < seq_len
        if WINDOW or CHUNK:
            mask_n = mask_n & (offs_n >= first)
        ptrs = _kv_tile_ptrs(
            cache_ptr,
            table_ptr + seq * stride_tb,
            offs_n,
            mask_n,
            offs_d,
            kv_head,
            stride_blk,
            stride_tok,
            stride_ch,
            BLOCK_SIZE,
        )
        mask_kv = mask_n[:, None] & (offs_d[None, :] < head_dim)
        k = _load_kv(ptrs, mask_kv, FP8, tl.float32)
        v = _load_kv(ptrs + stride_kv, mask_kv, FP8, tl.float32)
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2)
        if SOFT_CAP:
            scores = _soft_cap(scores, soft_cap)
        scores = tl.where(mask_n[None, :], scores, float("-inf"))
        p, alpha, m_i, l_i = _online_softmax(scores, m_i, l_i)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
    out = acc * (v_factor / tl.where(l_i > 0, l_i, 1.0))[:, None]
    o_ptrs = out_ptr + seq * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask_q)


@triton.jit
def _tile_ids(table_ptr, start, seq_len, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    """Block ids of the tile at ``start`` (a multiple of ``BLOCK_N``; one of ``BLOCK_N`` and
    ``BLOCK_SIZE`` divides the other): one per cache block, none read past ``seq_len``."""
    if BLOCK_N >= BLOCK_SIZE:  # one return: compiled Triton wants one type from both
        index = start // BLOCK_SIZE + tl.arange(0, BLOCK_N // BLOCK_SIZE)
        ids = tl.load(table_ptr + index, mask=index * BLOCK_SIZE < seq_len, other=0)
    else:
        ids = tl.load(table_ptr + start // BLOCK_SIZE, mask=start < seq_len, other=0)
    return ids


@triton.jit
def _tile_rows(
    ids,
    start,
    kv_head,
    stride_blk,
    stride_tok,
    stride_ch,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Cache offsets ``[BLOCK_N]`` of the tile at ``start`` from its ``_tile_ids``."""
    if BLOCK_N >= BLOCK_SIZE:
        rows = ids.to(tl.int64)[:, None] * stride_blk
        rows = rows + tl.arange(0, BLOCK_SIZE)[None, :] * stride_tok
        rows = tl.reshape(rows, [BLOCK_N])
    else:
        offs = start % BLOCK_SIZE + tl.arange(0, BLOCK_N)
        rows = ids.to(tl.int64) * stride_blk + offs * stride_tok
    return rows + kv_head * stride_ch


@triton.jit
def _split_bounds(
    seq_len,
    window,
    chunk,
    split,
    num_splits,
    BLOCK_N: tl.constexpr,
    WINDOW: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """``(first visible position, chunk start, chunk end)`` of split ``split``: the tiles
    holding visible positions, shared out evenly (a split may get none: start >= end)."""
    first = _first_visible(seq_len - 1, window, chunk, WINDOW, CHUNK)
    first_tile = first // BLOCK_N
    tiles = tl.cdiv(seq_len, BLOCK_N) - first_tile
    per_split = tl.cdiv(tiles, num_splits)
    start = (first_tile + split * per_split) * BLOCK_N
    return first, start, tl.minimum(start + per_split * BLOCK_N, seq_len)


@triton.jit(
    do_not_specialize=["stride_tb"],
    do_not_specialize_on_alignment=PER_STEP_SPLIT_POINTERS,
)
def _split_kernel(
    q_ptr,
    cache_ptr,
    table_ptr,
    seq_lens_ptr,
    acc_ptr,
    max_ptr,
    sum_ptr,
    stride_qb,
    stride_qh,
    stride_tb,
    stride_kv,
    stride_blk,
    stride_tok,
    stride_ch,
    qk_scale,
    head_dim,
    window,
    soft_cap,
    chunk,
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    DIM_P2: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    FP8: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
    WINDOW: tl.constexpr,
    SOFT_CAP: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """Program ``(seq, kv_head, split)``: the ``GROUP`` query heads of one kv head over one
    chunk of the context (``_split_bounds``), as ``BLOCK_H`` (>= 16) rows of two ``tl.dot``s.

    Writes the chunk's running max and denominator (log2 domain) and its unnormalised
    accumulator to the workspace ``[seqs, heads, splits(, head_dim)]``; an empty chunk
    writes max -1e30, denominator 0 and zeros. Sinks are left to ``_merge_kernel``.
    """
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    first, lo, hi = _split_bounds(seq_len, window, chunk, split, num_splits, BLOCK_N, WINDOW, CHUNK)
    offs_g = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, DIM_P2)
    heads = kv_head * GROUP + offs_g
    mask_q = (offs_g[:, None] < GROUP) & (offs_d[None, :] < head_dim)
    q_ptrs = q_ptr + seq * stride_qb + heads[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=mask_q, other=0.0).to(DOT_DTYPE)
    m_i = tl.full([BLOCK_H], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, DIM_P2], tl.float32)
    table_row = table_ptr + seq * stride_tb
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        mask_n = (offs_n < seq_len) & (offs_n >= first)
        ids = _tile_ids(table_row, start, seq_len, BLOCK_SIZE, BLOCK_N)
        rows = _tile_rows(
            ids, start, kv_head, stride_blk, stride_tok, stride_ch, BLOCK_SIZE, BLOCK_N
        )
        ptrs = cache_ptr + rows[:, None] + offs_d[None, :]
        mask_kv = mask_n[:, None] & (offs_d[None, :] < head_dim)
        k = _load_kv(ptrs, mask_kv, FP8, DOT_DTYPE)
        v = _load_kv(ptrs + stride_kv, mask_kv, FP8, DOT_DTYPE)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        if SOFT_CAP:
            scores = _soft_cap(scores, soft_cap)
        scores = tl.where(mask_n[None, :], scores, float("-inf"))
        p, alpha, m_i, l_i = _online_softmax(scores, m_i, l_i)
        pv = tl.dot(p.to(DOT_DTYPE), v, input_precision=PRECISION)
        acc = acc * alpha[:, None] + pv
    part = (seq * tl.num_programs(1) * GROUP + heads) * num_splits + split
    mask_h = offs_g < GROUP
    tl.store(max_ptr + part, m_i, mask=mask_h)
    tl.store(sum_ptr + part, l_i, mask=mask_h)
    tl.store(acc_ptr + part[:, None] * head_dim + offs_d[None, :], acc, mask=mask_q)


@triton.jit(
    do_not_specialize=["num_splits"],
    do_not_specialize_on_alignment=["acc_ptr", "max_ptr", "sum_ptr", "out_ptr"],
)
def _merge_kernel(
    acc_ptr,
    max_ptr,
    sum_ptr,
    out_ptr,
    sinks_ptr,
    stride_ob,
    stride_oh,
    num_splits,
    head_dim,
    v_factor,
    SPLITS_P2: tl.constexpr,
    DIM_P2: tl.constexpr,
    SINKS: tl.constexpr,
):
    """Program ``(seq, head)``: the row's partials weighted by ``exp2(max - overall max)``;
    the sink (if any) joins the denominator once. A row with nothing visible gives zeros."""
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs_s = tl.arange(0, SPLITS_P2)
    offs_d = tl.arange(0, DIM_P2)
    part = (seq * tl.num_programs(1) + head) * num_splits + offs_s
    mask_s = offs_s < num_splits
    maxes = tl.load(max_ptr + part, mask=mask_s, other=-1.0e30)
    sums = tl.load(sum_ptr + part, mask=mask_s, other=0.0)
    overall = tl.max(maxes, axis=0)
    if SINKS:
        sink = tl.load(sinks_ptr + head).to(tl.float32) * _LOG2E
        overall = tl.maximum(overall, sink)
    weights = tl.exp2(maxes - overall)
    total = tl.sum(weights * sums, axis=0)
    if SINKS:
        total += tl.exp2(sink - overall)
    mask_acc = mask_s[:, None] & (offs_d[None, :] < head_dim)
    accs = tl.load(acc_ptr + part[:, None] * head_dim + offs_d[None, :], mask=mask_acc, other=0.0)
    out = tl.sum(weights[:, None] * accs, axis=0) * (v_factor / tl.where(total > 0, total, 1.0))
    o_ptrs = out_ptr + seq * stride_ob + head * stride_oh + offs_d
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=offs_d < head_dim)


@functools.cache
def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (1 elsewhere: the interpreter)."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_context: int, sms: int) -> int:
    """Context splits of a decode launch; 1 means the single-pass kernel.

    Decode attention reads every cached key and value once, so it is fast only when the
    whole GPU has loads in flight. The split kernel aims at ``PROGRAMS_PER_SM`` programs
    per SM: ``num_seqs * num_kv_heads`` rows, each context split until there are that
    many (batch 1 splits most), at least 2, at most ``MAX_SPLITS``, and no split shorter
    than ``MIN_SPLIT_TOKENS`` of the longest possible context. The single pass (one
    program per row, 16-token CUDA-core tiles) is kept only for contexts too short for two
    splits: on an H200 (bf16, 32 q / 8 kv heads of 128) it was 2.2-2.9x slower than the
    split kernel at every shape measured: 32 x 128 (0.030 vs 0.014 ms), 32 x 1k, 32 x 2k
    (0.509 vs 0.135 ms), 256 x 1k (1.60 vs 0.64 ms), and 37x at 1 x 2k (32 splits).

    Only what is fixed for a captured CUDA graph goes in: ``max_context`` is the block
    table's width times the block size, never a step's sequence lengths.
    """
    if max_context < 2 * MIN_SPLIT_TOKENS:
        return 1
    wanted = -(-PROGRAMS_PER_SM * sms // max(1, num_seqs * num_kv_heads))
    return max(2, min(wanted, max_context // MIN_SPLIT_TOKENS, MAX_SPLITS))


def _split_warps(dtype: torch.dtype) -> int:
    """Warps per split program: 2 for half types (the measured best, see
    ``SPLIT_NUM_STAGES``), 4 for fp32, whose tiles are twice the registers."""
    if SPLIT_NUM_WARPS is not None:
        return SPLIT_NUM_WARPS
    return 2 if dtype in (torch.float16, torch.bfloat16) else 4


def _decode_kv_tile(block_size: int, group_p2: int, dim_p2: int) -> int:
    """Single pass: context tokens per loop step (the ``[group, tokens, dim]`` tile ≤ 8K)."""
    budget = triton.next_power_of_2(max(1, 8192 // (group_p2 * dim_p2)))
    return max(4, min(64, triton.next_power_of_2(block_size), budget))


def _split_kv_tile(block_size: int) -> int:
    """Split kernel: ``SPLIT_KV_TILE`` tokens, or a whole cache block when that is larger
    (halved at launch where the GPU's shared memory is too small: ``_tile_that_fits``)."""
    return max(SPLIT_KV_TILE, block_size)


@functools.cache
def shared_memory_limit(device: torch.device) -> int | None:
    """Shared memory one program may take on a CUDA device (its opt-in maximum: 227 KiB on
    an H100, 163 KiB on an A100, 99 KiB on an L4, L40S or A10); None elsewhere (the
    interpreter has no limit)."""
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).shared_memory_per_block_optin


def _tile_that_fits(grid: tuple, args: tuple, constexprs: dict, tile: int, limit: int) -> int:
    """The largest of ``tile``, ``tile / 2``, ... (at least ``MIN_DOT_TILE``) whose compiled
    split kernel takes at most ``limit`` bytes of shared memory, asked of Triton itself
    (``warmup`` compiles without launching; the launch then finds that compile cached).
    A 128-token tile of 128 dims took 139,264 bytes (Triton 3.7), 64 of Gemma's 256 dims
    147,456: more than the 99 KiB of an L4, L40S or A10, where the launch would fail. Every
    tile compiled took at least ``tile * DIM_P2 * 8`` bytes: tiles past that are skipped
    uncompiled (128 tokens of 256 dims took 38 s to compile for an H100, and cannot fit)."""
    key = (tile, limit, *constexprs.values())  # one call site: the same keys, in one order
    if key not in _FITTING_TILES:
        chosen = tile
        while chosen > MIN_DOT_TILE and chosen * constexprs["DIM_P2"] * 8 > limit:
            chosen //= 2  # past even the keys' and values' tiles (8 bytes a value): no compile
        while chosen > MIN_DOT_TILE:
            compiled = _split_kernel.warmup(*args, grid=grid, BLOCK_N=chosen, **constexprs)
            if compiled.metadata.shared <= limit:
                break
            chosen //= 2
        _FITTING_TILES[key] = chosen
    return _FITTING_TILES[key]


_FITTING_TILES: dict[tuple, int] = {}  # _tile_that_fits's answers, by tile, limit, launch


def _splittable(block_size: int) -> bool:
    """The split kernel's tiles hold whole blocks or whole fractions of one (powers of 2)."""
    return block_size & (block_size - 1) == 0


def paged_decode_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    scale: float,
    out: torch.Tensor | None = None,
    scales: KVScales = UNIT_SCALES,
    options: AttentionOptions = FULL_ATTENTION,
    num_splits: int | None = None,
    kv_tile: int | None = None,
) -> torch.Tensor:
    """One new token per sequence: ``query [B, heads, head_dim]`` → ``[B, heads, head_dim]``.

    ``max_seq_len`` is accepted for parity with ``torch_ops``; each program reads its own
    sequence length. ``out`` may be a preallocated ``[B, heads, head_dim]`` view.
    ``options``: the layer's window, soft-cap and sinks (``AttentionOptions``).
    ``num_splits`` forces a split count (1: the single pass; default ``choose_num_splits``)
    and ``kv_tile`` the split kernel's tokens per step (a power of 2, at least 16 on a GPU).
    """
    del max_seq_len
    query = _last_dim_contiguous(query)
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device) if out is None else out
    if query.shape[0] == 0:
        return out
    block_size = kv_cache.shape[2]
    if num_splits is None:
        max_context = block_tables.shape[1] * block_size
        sms = sm_count(query.device)
        num_splits = choose_num_splits(query.shape[0], kv_cache.shape[3], max_context, sms)
    if num_splits < 1:
        raise ValueError(f"num_splits must be at least 1, got {num_splits}")
    if num_splits == 1 or not _splittable(block_size):
        _single_pass(query, kv_cache, block_tables, seq_lens, scale, out, scales, options)
    else:
        tile = kv_tile or _split_kv_tile(block_size)
        launch = (query, kv_cache, block_tables, seq_lens, scale, out, scales, options)
        _split_kv(*launch, num_splits, tile)
    return out


def _single_pass(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    scales: KVScales,
    options: AttentionOptions,
) -> None:
    """``_decode_kernel`` over grid ``(seqs, kv_heads)``."""
    num_seqs, num_heads, head_dim = query.shape
    num_kv_heads = kv_cache.shape[3]
    extra = kernel_options(options, query)
    group = num_heads // num_kv_heads
    group_p2, dim_p2 = triton.next_power_of_2(group), triton.next_power_of_2(head_dim)
    cache = cache_format(kv_cache, scales)
    stride_kv, stride_blk, stride_tok, stride_ch = _cache_strides(cache.tensor)
    _decode_kernel[(num_seqs, num_kv_heads)](
        query,
        cache.tensor,
        block_tables,
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
        GROUP=group,
        GROUP_P2=group_p2,
        DIM_P2=dim_p2,
        BLOCK_SIZE=kv_cache.shape[2],
        BLOCK_N=_decode_kv_tile(kv_cache.shape[2], group_p2, dim_p2),
        FP8=cache.fp8,
        **extra,
    )


def _split_kv(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    scales: KVScales,
    options: AttentionOptions,
    num_splits: int,
    kv_tile: int,
) -> None:
    """``_split_kernel`` over grid ``(seqs, kv_heads, num_splits)``, then ``_merge_kernel``
    over ``(seqs, heads)``. The fp32 workspace is allocated here: inside a CUDA graph's
    capture it comes from the graph's pool and stays the graph's own."""
    num_seqs, num_heads, head_dim = query.shape
    extra = kernel_options(options, query)
    sinks, has_sinks = extra.pop("sinks_ptr"), extra.pop("SINKS")
    rows = num_seqs * num_heads * num_splits
    parts = torch.empty(rows * (head_dim + 2), dtype=torch.float32, device=query.device)
    acc, maxes, sums = parts.split([rows * head_dim, rows, rows])
    cache = cache_format(kv_cache, scales)
    workspace = (acc, maxes, sums)
    args, keywords = _split_arguments(query, cache, block_tables, seq_lens, workspace, scale)
    grid = (num_seqs, kv_cache.shape[3], num_splits)
    limit = shared_memory_limit(query.device)
    if limit is not None:
        kv_tile = _tile_that_fits(grid, args, {**keywords, **extra}, kv_tile, limit)
    _split_kernel[grid](*args, BLOCK_N=kv_tile, **keywords, **extra)
    _merge_kernel[(num_seqs, num_heads)](
        acc,
        maxes,
        sums,
        out,
        sinks,
        out.stride(0),
        out.stride(1),
        num_splits,
        head_dim,
        cache.v_factor,
        SPLITS_P2=triton.next_power_of_2(num_splits),
        DIM_P2=triton.next_power_of_2(head_dim),
        SINKS=has_sinks,
    )


def _split_arguments(
    query: torch.Tensor,
    cache: CacheFormat,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    workspace: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    scale: float,
) -> tuple[tuple, dict]:
    """``_split_kernel``'s positional arguments, and its keywords but ``BLOCK_N`` and the
    layer's options."""
    num_heads, head_dim = query.shape[1], query.shape[2]
    stride_kv, stride_blk, stride_tok, stride_ch = _cache_strides(cache.tensor)
    dot_dtype = _dot_dtype(query)
    args = (query, cache.tensor, block_tables, seq_lens, *workspace)
    args += (query.stride(0), query.stride(1), block_tables.stride(0))
    args += (stride_kv, stride_blk, stride_tok, stride_ch, scale * LOG2E * cache.k_factor)
    group = num_heads // cache.tensor.shape[3]
    keywords = {
        "head_dim": head_dim,
        "GROUP": group,
        "BLOCK_H": max(16, triton.next_power_of_2(group)),
        "DIM_P2": triton.next_power_of_2(head_dim),
        "BLOCK_SIZE": cache.tensor.shape[2],
        "FP8": cache.fp8,
        "DOT_DTYPE": dot_dtype,
        "PRECISION": "ieee" if dot_dtype == tl.float32 else "tf32",
        "num_warps": _split_warps(query.dtype),
        "num_stages": SPLIT_NUM_STAGES,
    }
    return args, keywords
