"""`python -m octavo_bench cpu-attention`: the native CPU attention kernels, side by side.

Prefill (one fresh prompt of each ``--prefill`` length, causal) and decode (``--decode``
cases ``SEQSxCONTEXT``: that many sequences, one query each, over a context of that many
tokens) on a model's attention shape (default SmolLM2-135M's: 9 query heads, 3 KV heads of
64), in one dtype, on ``--num-threads`` threads. Per case, the median ms per call of:
Octavo's native kernel (``torch.ops.octavo_cpu``, over a shuffled paged cache of
``--block-size`` token blocks, the engine's default 16), the torch path the engine falls
back to (``TorchAttention``: SDPA for a fresh prompt, the grouped gather for decode), and
vLLM's CPU attention op from its own venv (``cpu_attention_vllm_runner.py``, in blocks of
``--vllm-block-size``, its default 128; skipped, with the reason, without it). Also the
kernel's largest difference from the torch path, and attention GFLOP/s (2 x 2 x heads x
head_dim per visible query-key pair; causal pairs for prefill). Writes
``cpu_attention.json`` and ``cpu_attention.png``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from octavo.attention import torch_ops
from octavo.attention.backend import TorchAttention
from octavo.attention.metadata import AttentionMetadata
from octavo.kernels.cpu_build import cpu_isa, cpu_ops
from octavo_bench.parsers import add_output_dir, register_subcommand
from octavo_bench.report import machine_info, ratio, save, table
from octavo_bench.vllm_baseline import VllmRunError, VllmSetup, add_vllm_arguments, run_runner

RUNNER = Path(__file__).resolve().with_name("cpu_attention_vllm_runner.py")
BLOCK_SIZE = 16  # the engine's default
VLLM_BLOCK_SIZE = 128  # vLLM's CPU default


@dataclass(frozen=True)
class Case:
    name: str
    query_lens: list[int]
    seq_lens: list[int]
    prefill: bool  # one fresh prompt (else one decode query per sequence)

    @property
    def pairs(self) -> int:
        """Visible (query, key) pairs: causal within the chunk, all of the prefix."""
        return sum(
            q * (s - q) + q * (q + 1) // 2
            for q, s in zip(self.query_lens, self.seq_lens, strict=True)
        )


@dataclass
class CaseResult:
    name: str
    octavo_ms: float
    torch_ms: float
    max_abs_diff: float
    gflop: float
    vllm_ms: float | None = None

    def gflops(self, ms: float | None) -> float | None:
        return self.gflop / ms * 1e3 if ms else None


@dataclass
class CpuAttentionReport:
    config: dict
    results: list[CaseResult] = field(default_factory=list)
    vllm: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        rows = [
            {
                **asdict(r),
                "octavo_gflops": r.gflops(r.octavo_ms),
                "torch_gflops": r.gflops(r.torch_ms),
                "vllm_gflops": r.gflops(r.vllm_ms),
                "octavo_vs_torch": ratio(r.torch_ms, r.octavo_ms),
                "octavo_vs_vllm": ratio(r.vllm_ms, r.octavo_ms) if r.vllm_ms else None,
            }
            for r in self.results
        ]
        return {"config": self.config, "vllm": self.vllm, "results": rows, "notes": self.notes}

    def text(self) -> str:
        headers = ["case", "octavo ms", "torch ms", "vllm ms", "GFLOP/s (o/t/v)", "vs torch"]
        headers += ["vs vllm", "max |diff|"]
        rows = [
            [
                r.name,
                f"{r.octavo_ms:.3f}",
                f"{r.torch_ms:.3f}",
                f"{r.vllm_ms:.3f}" if r.vllm_ms else "-",
                "/".join(f"{g:.0f}" if g else "-" for g in self._gflops(r)),
                f"{r.torch_ms / r.octavo_ms:.2f}x",
                f"{r.vllm_ms / r.octavo_ms:.2f}x" if r.vllm_ms else "-",
                f"{r.max_abs_diff:.2e}",
            ]
            for r in self.results
        ]
        lines = [f"CPU attention kernels: {self.config}", table(headers, rows), *self.notes]
        return "\n".join(lines)

    @staticmethod
    def _gflops(r: CaseResult) -> list[float | None]:
        return [r.gflops(r.octavo_ms), r.gflops(r.torch_ms), r.gflops(r.vllm_ms)]

    def draw(self, plt):
        figure, axes = plt.subplots(figsize=(9, 4))
        width = 0.27
        for offset, (label, index) in enumerate((("octavo", 0), ("torch", 1), ("vllm", 2))):
            values = [self._gflops(r)[index] or 0.0 for r in self.results]
            xs = [i + (offset - 1) * width for i in range(len(self.results))]
            axes.bar(xs, values, width, label=label)
        axes.set_xticks(range(len(self.results)), [r.name for r in self.results], rotation=20)
        axes.set_ylabel("attention GFLOP/s")
        axes.set_title(f"CPU attention, {self.config['dtype']}, {self.config['threads']} threads")
        axes.legend()
        return figure


def parse_cases(prefill: str, decode: str) -> list[Case]:
    lengths = [int(n) for n in filter(None, prefill.split(","))]
    cases = [Case(f"prefill {n}", [n], [n], prefill=True) for n in lengths]
    for spec in filter(None, decode.split(",")):
        seqs, context = (int(part) for part in spec.lower().split("x"))
        cases.append(Case(f"decode {seqs}x{context}", [1] * seqs, [context] * seqs, prefill=False))
    return cases


@dataclass
class CaseInputs:
    query: torch.Tensor
    cache: torch.Tensor
    meta: AttentionMetadata
    fresh_keys: torch.Tensor | None  # a fresh prompt's keys/values, as the torch path takes them
    fresh_values: torch.Tensor | None


def case_inputs(
    case: Case, heads: int, kv_heads: int, dim: int, dtype, block_size: int = BLOCK_SIZE
) -> CaseInputs:
    generator = torch.Generator().manual_seed(0)
    widths = [-(-n // block_size) for n in case.seq_lens]
    order = (torch.randperm(sum(widths), generator=generator) + 1).int()
    cache = torch.randn(2, sum(widths) + 1, block_size, kv_heads, dim, generator=generator)
    cache = cache.to(dtype)
    table_ = torch.zeros(len(widths), max(widths), dtype=torch.int32)
    for row, width in enumerate(widths):
        table_[row, :width] = order[sum(widths[:row]) : sum(widths[: row + 1])]
    starts = [0]
    for length in case.query_lens:
        starts.append(starts[-1] + length)
    query = torch.randn(starts[-1], heads, dim, generator=generator).to(dtype)
    prefills = len(case.seq_lens) if case.prefill else 0
    meta = AttentionMetadata(
        slot_mapping=torch.zeros(starts[-1], dtype=torch.long),
        block_tables=table_,
        seq_lens=torch.tensor(case.seq_lens, dtype=torch.int32),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        num_prefills=prefills,
        num_prefill_tokens=starts[-1] if prefills else 0,
        query_lens_list=case.query_lens,
        query_start_loc_list=starts[:-1],
        seq_lens_list=case.seq_lens,
        max_seq_len=max(case.seq_lens),
    )
    keys = values = None
    if case.prefill:
        keys, values = (
            x[0].transpose(0, 1) for x in torch_ops.gather_kv(cache, table_, starts[-1])
        )
        keys, values = keys.contiguous(), values.contiguous()
    return CaseInputs(query, cache, meta, keys, values)


def timed_ms(call: Callable[[], object], repeats: int) -> float:
    for _ in range(3):
        call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def run_octavo(case: Case, args: argparse.Namespace, dtype) -> CaseResult:
    ops = cpu_ops()
    x = case_inputs(case, args.heads, args.kv_heads, args.head_dim, dtype, args.block_size)
    scale = args.head_dim**-0.5
    out = torch.empty_like(x.query)
    meta = x.meta
    if meta.num_prefills:

        def native() -> None:
            ops.paged_prefill_attention(
                out, x.query, x.cache, meta.block_tables, meta.query_start_loc, meta.seq_lens, scale
            )

        def reference() -> torch.Tensor:
            return torch_ops.causal_attention(x.query, x.fresh_keys, x.fresh_values, scale)
    else:

        def native() -> None:
            ops.paged_decode_attention(
                out, x.query, x.cache, meta.block_tables, meta.seq_lens, scale
            )

        def reference() -> torch.Tensor:
            meta.backend_cache.clear()  # the plan is derived once per step, timed with it
            return TorchAttention().decode(x.query, x.cache, meta, scale)

    octavo_ms, torch_ms = timed_ms(native, args.repeats), timed_ms(reference, args.repeats)
    native()
    diff = (out.float() - reference().float()).abs().max().item()
    gflop = 4 * args.heads * args.head_dim * case.pairs / 1e9
    return CaseResult(case.name, octavo_ms, torch_ms, diff, gflop)


def run_vllm(report: CpuAttentionReport, cases: list[Case], args: argparse.Namespace) -> None:
    setup = VllmSetup.from_args(args)
    if setup.python is None:
        report.notes.append(f"vLLM skipped: {setup.skip_reason}")
        return
    request = {
        "dtype": args.dtype,
        "heads": args.heads,
        "kv_heads": args.kv_heads,
        "head_dim": args.head_dim,
        "block_size": args.vllm_block_size,
        "threads": args.num_threads,
        "repeats": args.repeats,
        "cases": [asdict(case) for case in cases],
    }
    log = args.output_dir / "cpu_attention-vllm.log"
    try:
        result = run_runner(setup, request, log, runner=RUNNER)
    except VllmRunError as error:
        report.notes.append(f"vLLM failed: {error}")
        return
    report.vllm = {"version": result["vllm_version"], "isa": result["isa"], "log": str(log)}
    for row, measured in zip(report.results, result["results"], strict=True):
        row.vllm_ms = measured["ms"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prefill", default="64,256,512,1024", help="prompt lengths")
    parser.add_argument("--decode", default="32x200,64x400,16x1024", help="SEQSxCONTEXT cases")
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--num-threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--block-size", type=int, default=BLOCK_SIZE, help="tokens per block of Octavo's cache"
    )
    parser.add_argument(
        "--vllm-block-size",
        type=int,
        default=VLLM_BLOCK_SIZE,
        help="tokens per block of vLLM's cache (its CPU default: 128)",
    )
    parser.add_argument(
        "--baselines", default="vllm", help="'vllm' to time vLLM's CPU op too, '' for none"
    )
    add_vllm_arguments(parser)
    add_output_dir(parser, "cpu_attention")


def register(kinds: argparse._SubParsersAction) -> None:
    register_subcommand(
        kinds, "cpu-attention", "native CPU attention kernels", __doc__, "", add_arguments, run
    )


def run(args: argparse.Namespace) -> int:
    if cpu_ops() is None:
        print("the native CPU kernels are unavailable here: nothing to measure")
        return 1
    torch.set_num_threads(args.num_threads)
    dtype = getattr(torch, args.dtype)
    cases = parse_cases(args.prefill, args.decode)
    config = {
        "dtype": args.dtype,
        "threads": args.num_threads,
        "shape": f"{args.heads} q / {args.kv_heads} kv heads of {args.head_dim}",
        "block_size": args.block_size,
        "vllm_block_size": args.vllm_block_size,
        "octavo_isa": cpu_isa(),
        "machine": machine_info(),
    }
    report = CpuAttentionReport(config)
    for case in cases:
        report.results.append(run_octavo(case, args, dtype))
        print(f"{case.name}: octavo {report.results[-1].octavo_ms:.3f} ms", flush=True)
    if "vllm" in args.baselines.split(","):
        run_vllm(report, cases, args)
    save(report, args.output_dir, "cpu_attention")
    return 0
