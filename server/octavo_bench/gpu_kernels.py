"""``python -m octavo_bench gpu``'s kernel part: each Triton kernel against the torch path.

Same inputs to both; the report keeps the time per call of each (CUDA events, after a
warm-up) and the largest absolute difference. Shapes are a 1B-class model's decode
attention (32 query heads, 8 KV heads of 128, bf16) and its gated MLP.

Prefill attention (the Triton kernel, every chunk in one launch, vs the torch path's
gather and SDPA per chunk) is timed on 4 fresh 512-token prompts and on one 512-token chunk
over a 2k context, with its TFLOP/s and a sweep of warps and context tile.
Decode attention is timed per layer call at 32 sequences x 1k and 2k context and at 1
sequence x 2k: the torch path (``TorchAttention.decode``), the single-pass Triton kernel
and the split-KV kernel at the split count ``choose_num_splits`` picks (plus a sweep of
split counts and of launch settings, to refine both), each with the K+V bytes it must
read per second. Beside the split kernel and each prefill row: torch's FlashAttention-2 on
the same keys and values in blocks of 256 tokens (``gpu_flash.py``), the candidate that
comes with torch.
These calls are timed as CUDA-graph replays, as decode steps run them: eager, Python's
launch cost (tens of microseconds a call) would hide what the GPU takes.
(1 x 2k reads 8 MiB, which an H100's 50 MB L2 holds between calls: above HBM speed.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch

from octavo.attention import torch_ops, triton_decode, triton_kernels
from octavo.attention.backend import TorchAttention
from octavo.attention.triton_decode import choose_num_splits, paged_decode_attention, sm_count
from octavo.model_executor.step_inputs import lay_out, step_inputs
from octavo.scheduler.output import ScheduledSequence
from octavo_bench.gpu_flash import flash_attention_call, flash_available, relay_cache
from octavo_bench.report import table


@dataclass(frozen=True)
class KernelResult:
    name: str
    triton_ms: float
    torch_ms: float
    max_abs_diff: float
    max_reference: float  # the largest |value| the torch path gave: the scale of the diff
    bytes_read: int | None = None  # what one call must read (decode attention: K + V)
    sweep_ms: dict[int, float] | None = None  # split-KV: ms per call by forced split count
    launch_ms: dict[str, float] | None = None  # ms by "w{warps}t{tile}" launch (swept)
    flop: int | None = None  # what one call computes (prefill attention)
    # torch's FlashAttention-2 on the same keys and values in blocks of 256 (gpu_flash.py):
    # ms per call and max |diff| against the torch path; None off CUDA, NaN where it failed
    flash_ms: float | None = None
    flash_max_abs_diff: float | None = None
    flash_kind: str | None = None  # "paged" (the FLASH_ATTN launch) or "contiguous" (torch < 2.13)

    @property
    def speedup(self) -> float:
        return self.torch_ms / self.triton_ms if self.triton_ms > 0 else 0.0

    @property
    def max_rel_diff(self) -> float:
        """The largest difference relative to the output's scale (bf16 rounds at 2**-8)."""
        return self.max_abs_diff / self.max_reference if self.max_reference > 0 else 0.0

    @property
    def triton_gb_s(self) -> float | None:
        """Achieved bandwidth of the Triton kernel: ``bytes_read`` per second, in GB/s."""
        return gb_per_s(self.bytes_read, self.triton_ms)

    @property
    def torch_gb_s(self) -> float | None:
        return gb_per_s(self.bytes_read, self.torch_ms)

    @property
    def flash_gb_s(self) -> float | None:
        return gb_per_s(self.bytes_read, self.flash_ms) if self.flash_ms else None

    @property
    def triton_tflop_s(self) -> float | None:
        return tflop_per_s(self.flop, self.triton_ms)

    @property
    def torch_tflop_s(self) -> float | None:
        return tflop_per_s(self.flop, self.torch_ms)

    @property
    def flash_tflop_s(self) -> float | None:
        return tflop_per_s(self.flop, self.flash_ms) if self.flash_ms else None

    def to_json(self) -> dict:
        derived = {"speedup": self.speedup, "max_rel_diff": self.max_rel_diff}
        return {
            **asdict(self),
            **derived,
            "triton_gb_s": self.triton_gb_s,
            "torch_gb_s": self.torch_gb_s,
            "triton_tflop_s": self.triton_tflop_s,
            "torch_tflop_s": self.torch_tflop_s,
            "flash_gb_s": self.flash_gb_s,
            "flash_tflop_s": self.flash_tflop_s,
        }


def gb_per_s(num_bytes: int | None, ms: float) -> float | None:
    return num_bytes / (ms * 1e6) if num_bytes and ms > 0 else None


def tflop_per_s(flop: int | None, ms: float) -> float | None:
    return flop / (ms * 1e9) if flop and ms > 0 else None


def time_ms(fn: Callable[[], torch.Tensor], repeats: int = 20) -> float:
    """Mean milliseconds per call on the GPU (CUDA events), after three warm-up calls."""
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def graph_time_ms(fn: Callable[[], torch.Tensor], repeats: int = 20) -> float:
    """GPU milliseconds per call: ``repeats`` calls captured in one CUDA graph and replayed,
    as the decode step runs them (no Python launch cost, which would hide a short kernel);
    eager ``time_ms`` where the call cannot be captured."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(repeats):
                fn()
    except RuntimeError:
        return time_ms(fn, repeats)
    return time_ms(graph.replay, 3) / repeats


@dataclass(frozen=True, kw_only=True)
class HeadLayout:
    """A 1B-class model's attention heads and the cache's block size (keywords only, so
    each shape below keeps its own fields first)."""

    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    block_size: int = 16


@dataclass(frozen=True)
class DecodeShape(HeadLayout):
    """One decode-attention launch: rows x cached context."""

    seqs: int
    context: int

    @property
    def label(self) -> str:
        kilo = self.context % 1024 == 0
        label = f"{self.seqs}x{self.context // 1024}k" if kilo else f"{self.seqs}x{self.context}"
        return label if self.block_size == 16 else f"{label} b{self.block_size}"

    def kv_bytes(self, dtype: torch.dtype) -> int:
        """Keys and values a call must read: every cached token of every sequence."""
        elements = 2 * self.seqs * self.context * self.kv_heads * self.head_dim
        return elements * torch.empty((), dtype=dtype).element_size()


# 32 x 2k again in blocks of 64 and 128 tokens (--block-size): longer runs per block read
DECODE_SHAPES = (
    DecodeShape(32, 1024),
    DecodeShape(32, 2048),
    DecodeShape(32, 2048, block_size=64),
    DecodeShape(32, 2048, block_size=128),
    DecodeShape(1, 2048),
)
SWEEP_SPLITS = (2, 4, 8, 16, 32)
SWEEP_LAUNCHES = ((1, 32), (2, 32), (2, 64), (4, 64))  # (warps, kv tile) at the rule's splits


def launch_sweep(call: Callable[..., Callable[[], torch.Tensor]], splits: int) -> dict:
    """ms per call of the split kernel at each ``SWEEP_LAUNCHES`` warps and tile (NaN for
    one that does not compile: it fails in the warm-up, before any capture)."""
    timings = {}
    try:
        for warps, tile in SWEEP_LAUNCHES:
            triton_decode.SPLIT_NUM_WARPS = warps
            try:
                ms = graph_time_ms(call(num_splits=splits, kv_tile=tile), 10)
            except Exception:  # a compile error: the sweep is advice, not a check
                ms = float("nan")
            timings[f"w{warps}t{tile}"] = ms
    finally:
        triton_decode.SPLIT_NUM_WARPS = None
    return timings


def decode_inputs(shape: DecodeShape, device: torch.device, dtype: torch.dtype):
    """``(query, cache, meta)``: each sequence one query token over ``context`` cached
    ones, in blocks of its own (block 0 is the null block)."""
    blocks_each = shape.context // shape.block_size
    scheduled = [
        ScheduledSequence(i, [0], shape.context - 1, _blocks(i, blocks_each), True)
        for i in range(shape.seqs)
    ]
    meta = step_inputs(lay_out(scheduled, shape.block_size), 0, device).meta
    cache_shape = (
        2,
        1 + shape.seqs * blocks_each,
        shape.block_size,
        shape.kv_heads,
        shape.head_dim,
    )
    cache = torch.randn(cache_shape, dtype=dtype, device=device)
    query = torch.randn(shape.seqs, shape.heads, shape.head_dim, dtype=dtype, device=device)
    return query, cache, meta


def decode_attention(
    device: torch.device, dtype: torch.dtype, shape: DecodeShape
) -> list[KernelResult]:
    """The single-pass and the split-KV kernel against the torch path on one shape."""
    query, cache, meta = decode_inputs(shape, device, dtype)
    scale, out = shape.head_dim**-0.5, torch.empty_like(query)

    def triton_call(**forced) -> Callable[[], torch.Tensor]:
        args = (query, cache, meta.block_tables, meta.seq_lens, shape.context, scale)
        return lambda: paged_decode_attention(*args, out=out, **forced)

    def torch_call() -> torch.Tensor:
        return TorchAttention().decode(query, cache, meta, scale)

    splits = choose_num_splits(shape.seqs, shape.kv_heads, shape.context, sm_count(device))
    name = f"decode {shape.label}"
    timer = graph_time_ms
    single = compare(f"{name} single pass", triton_call(num_splits=1), torch_call, timer)
    forced = max(2, splits)  # timed even where the rule keeps the single pass
    rule = "" if splits > 1 else " (rule: single pass)"
    split_call = triton_call(num_splits=forced)
    split = compare(f"{name} split x{forced}{rule}", split_call, torch_call, timer)
    sweep = {n: timer(triton_call(num_splits=n), 10) for n in SWEEP_SPLITS}
    launches = launch_sweep(triton_call, forced)
    bytes_read = shape.kv_bytes(dtype)
    split = replace(split, bytes_read=bytes_read, sweep_ms=sweep, launch_ms=launches)
    flash = with_flash(split, query, cache, meta, scale, torch_call)
    return [replace(single, bytes_read=bytes_read), flash]


@dataclass(frozen=True)
class PrefillShape(HeadLayout):
    """One prefill-attention launch: ``chunks`` chunks of ``query`` new tokens, each the
    end of a ``context``-token sequence (``query == context``: fresh prompts, as nano-vllm's
    offline shape starts with)."""

    chunks: int
    query: int
    context: int

    @property
    def label(self) -> str:
        prefix = "" if self.query == self.context else f"@{self.context}"
        return f"{self.chunks}x{self.query}{prefix}"

    def flop(self) -> int:
        """QK^T and PV over the causal (query, key) pairs: 4 x pairs x head_dim a head."""
        first = self.context - self.query  # the first query's position
        pairs = self.query * (first + 1) + self.query * (self.query - 1) // 2
        return 4 * self.chunks * self.heads * self.head_dim * pairs


PREFILL_SHAPES = (PrefillShape(4, 512, 512), PrefillShape(1, 512, 2048))
PREFILL_LAUNCHES = ((4, 16), (4, 32), (4, 64), (8, 64))  # (warps, kv tile) swept


def prefill_inputs(shape: PrefillShape, device: torch.device, dtype: torch.dtype):
    """``(query, cache, meta)``: each chunk's keys/values already in blocks of its own."""
    blocks_each = -(-shape.context // shape.block_size)
    first = shape.context - shape.query
    scheduled = [
        ScheduledSequence(i, [0] * shape.query, first, _blocks(i, blocks_each), True)
        for i in range(shape.chunks)
    ]
    meta = step_inputs(lay_out(scheduled, shape.block_size), shape.chunks, device).meta
    blocks = 1 + shape.chunks * blocks_each
    cache_shape = (2, blocks, shape.block_size, shape.kv_heads, shape.head_dim)
    cache = torch.randn(cache_shape, dtype=dtype, device=device)
    tokens = shape.chunks * shape.query
    query = torch.randn(tokens, shape.heads, shape.head_dim, dtype=dtype, device=device)
    return query, cache, meta


def _blocks(index: int, count: int) -> list[int]:
    """Sequence ``index``'s ``count`` blocks (block 0 is the null block)."""
    return list(range(1 + index * count, 1 + (index + 1) * count))


def prefill_attention(
    device: torch.device, dtype: torch.dtype, shape: PrefillShape
) -> KernelResult:
    """The Triton prefill kernel (one launch for every chunk) against the torch path (a
    gather and SDPA per chunk), with a sweep of its launch (warps, context tile)."""
    query, cache, meta = prefill_inputs(shape, device, dtype)
    scale, out = shape.head_dim**-0.5, torch.empty_like(query)
    starts, count = meta.query_start_loc_list, shape.chunks
    args = (query, cache, meta.block_tables[:count], meta.query_start_loc[: count + 1])

    def triton_call(**launch) -> Callable[[], torch.Tensor]:
        rest = (meta.seq_lens[:count], shape.query, scale)
        return lambda: triton_kernels.prefill_attention(*args, *rest, out=out, **launch)

    def torch_call() -> torch.Tensor:
        return torch.cat(
            [
                torch_ops.prefill_attention(
                    query[starts[i] : starts[i] + shape.query],
                    cache,
                    meta.block_tables[i],
                    shape.context,
                    scale,
                )
                for i in range(count)
            ]
        )

    result = compare(f"prefill {shape.label}", triton_call(), torch_call, graph_time_ms)
    launches = {}
    for warps, tile in PREFILL_LAUNCHES:
        try:
            launches[f"w{warps}t{tile}"] = graph_time_ms(triton_call(num_warps=warps, kv_tile=tile))
        except Exception:  # a compile error: the sweep is advice, not a check
            launches[f"w{warps}t{tile}"] = float("nan")
    result = replace(result, flop=shape.flop(), launch_ms=launches)
    return with_flash(result, query, cache, meta, scale, torch_call)


def with_flash(result: KernelResult, query, cache, meta, scale: float, torch_fn) -> KernelResult:
    """``result`` with the FLASH_ATTN backend's launch timed on the same keys and values (every
    sequence of ``meta``) in its 256-token pages; as it is off CUDA."""
    if not flash_available(query.device):
        return result
    layout = relay_cache(cache, meta.block_tables, meta.seq_lens_list)
    kind, call = flash_attention_call(query, layout, meta, scale)
    try:
        difference = (call().float() - torch_fn().float()).abs().max().item()
        timed = dict(flash_ms=graph_time_ms(call), flash_max_abs_diff=difference)
        return replace(result, **timed, flash_kind=kind)
    except RuntimeError as error:  # a shape the kernel refuses: the row says so, the rest runs
        print(f"{result.name}: FlashAttention-2 ({kind}) failed: {error}")
        return replace(result, flash_ms=float("nan"), flash_kind=kind)


def decode_table(results: list[KernelResult]) -> str:
    """The decode rows with their achieved bandwidth and the split sweep."""
    headers = ["kernel", "triton ms", "GB/s", "torch ms", "torch GB/s", "max |diff|"]
    headers += [*FLASH_HEADERS, "FA2 GB/s", "sweep ms"]
    rows = []
    for r in results:
        swept = {**(r.sweep_ms or {}), **(r.launch_ms or {})}
        sweep = " ".join(f"{key}:{ms:.4f}" for key, ms in swept.items())
        rows.append(
            [
                r.name,
                f"{r.triton_ms:.4f}",
                f"{r.triton_gb_s or 0:.0f}",
                f"{r.torch_ms:.4f}",
                f"{r.torch_gb_s or 0:.0f}",
                f"{r.max_abs_diff:.2e}",
                *flash_cells(r),
                f"{r.flash_gb_s:.0f}" if r.flash_gb_s else "-",
                sweep,
            ]
        )
    return table(headers, rows)


# torch's FlashAttention-2 in pages of 256: paged, or contiguous keys (torch < 2.13)
FLASH_HEADERS = ["FA2", "FA2 ms", "FA2 |diff|"]


def flash_cells(row: KernelResult) -> list[str]:
    """FlashAttention-2's kind, time and difference; "-" where it did not run (off CUDA)."""
    if row.flash_ms is None:
        return ["-", "-", "-"]
    difference = row.flash_max_abs_diff
    cells = [f"{row.flash_ms:.4f}", "-" if difference is None else f"{difference:.2e}"]
    return [row.flash_kind or "-", *cells]


def prefill_table(results: list[KernelResult]) -> str:
    """The prefill rows with their achieved TFLOP/s and the launch sweep."""
    headers = ["kernel", "triton ms", "TFLOP/s", "torch ms", "torch TFLOP/s", *FLASH_HEADERS]
    headers += ["FA2 TFLOP/s", "sweep ms"]
    rows = [
        [
            r.name,
            f"{r.triton_ms:.4f}",
            f"{r.triton_tflop_s or 0:.1f}",
            f"{r.torch_ms:.4f}",
            f"{r.torch_tflop_s or 0:.1f}",
            *flash_cells(r),
            f"{r.flash_tflop_s:.1f}" if r.flash_tflop_s else "-",
            " ".join(f"{key}:{ms:.4f}" for key, ms in (r.launch_ms or {}).items()),
        ]
        for r in results
    ]
    return table(headers, rows)


def gated_activation(device: torch.device, dtype: torch.dtype, rows: int = 256) -> KernelResult:
    """SiLU(gate) * up over an 8,192-wide intermediate (Triton kernel vs torch ops)."""
    from octavo.model_executor.layers.triton_activation import gated_activation_triton

    x = torch.randn(rows, 2 * 8192, dtype=dtype, device=device)

    def reference() -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up

    return compare("SiLU and mul", lambda: gated_activation_triton(x, "silu"), reference)


def fused_add_rms_norm(device: torch.device, dtype: torch.dtype, rows: int = 1) -> KernelResult:
    """Residual add + RMSNorm over a 2,048-wide hidden state (a decode step's batch-1 row):
    the Triton kernel in place vs the torch path's add, then ``F.rms_norm``."""
    from octavo.model_executor.layers.layernorm import RMSNorm
    from octavo.model_executor.layers.triton_norm import rms_norm_triton

    norm = RMSNorm(2048, 1e-5).to(device=device, dtype=dtype)
    x, residual = (torch.randn(rows, 2048, dtype=dtype, device=device) for _ in range(2))

    def kernel() -> torch.Tensor:  # fresh copies: the kernel overwrites both
        return rms_norm_triton(x.clone(), norm.weight, norm.eps, residual.clone())

    def reference() -> torch.Tensor:
        return norm.forward_native(x.clone(), residual.clone())[0]

    return compare(f"add + RMSNorm x{rows}", kernel, reference, graph_time_ms)


def rotary(device: torch.device, dtype: torch.dtype, tokens: int = 1) -> KernelResult:
    """Llama-3 rope over the joint query+key heads (32 + 8 of 128) of a fused QKV row: the
    Triton kernel in place vs the torch path (cos/sin rows, rotate-half, multiply, add)."""
    from octavo.model_executor.rotary import RotaryEmbedding, apply_rotary
    from octavo.model_executor.triton_rotary import rotary_triton

    table = RotaryEmbedding(128, 8192, {"rope_type": "default", "rope_theta": 5e5}, dtype, device)
    qkv = torch.randn(tokens, 48 * 128, dtype=dtype, device=device)
    positions = torch.randint(0, 8192, (tokens,), device=device)

    def joint() -> torch.Tensor:  # a fresh copy: the kernel rotates in place
        return qkv.clone()[:, : 40 * 128].view(tokens, 40, 128)

    def kernel() -> torch.Tensor:
        heads = joint()
        rotary_triton(positions, heads, table.cos, table.sin)
        return heads

    def reference() -> torch.Tensor:
        cos, sin = table.tables(positions)
        heads = joint()
        return heads.copy_(apply_rotary(heads, cos, sin))

    return compare(f"rotary x{tokens}", kernel, reference, graph_time_ms)


def compare(name: str, triton_fn, torch_fn, timer=None) -> KernelResult:
    timer = timer or time_ms
    reference = torch_fn().float()
    difference = (triton_fn().float() - reference).abs().max().item()
    scale = reference.abs().max().item()
    return KernelResult(name, timer(triton_fn), timer(torch_fn), difference, scale)


def all_kernels(device: torch.device, dtype: torch.dtype) -> list[KernelResult]:
    """Every kernel row; prints the decode rows' bandwidth table (the report's own table
    has no GB/s column)."""
    decode = [row for shape in DECODE_SHAPES for row in decode_attention(device, dtype, shape)]
    print("== decode attention: achieved K+V bandwidth ==", decode_table(decode), sep="\n")
    prefill = [prefill_attention(device, dtype, shape) for shape in PREFILL_SHAPES]
    print("== prefill attention: achieved TFLOP/s ==", prefill_table(prefill), sep="\n")
    norms = [fused_add_rms_norm(device, dtype, rows) for rows in (1, 256)]
    ropes = [rotary(device, dtype, tokens) for tokens in (1, 256)]
    return [*decode, *prefill, gated_activation(device, dtype), *norms, *ropes]
