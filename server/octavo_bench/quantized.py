"""`python -m octavo_bench quantized`: SmolLM2 unquantized against Octavo's quantizations
and llama.cpp on the same GGUF file, in one run.

Variants (``--variants``): ``bf16`` (the float expansion of the embedded model, in
``--dtype``), ``int8`` (W8A8), ``fp8`` (on CPU the widening path: a correctness path,
expected slower), ``gguf`` (the wheel's Q4_1 file kept quantized), and ``llama.cpp``
(llama-cpp-python from its own venv, `make llama-cpp-venv`, same Q4_1 file, same thread
count). Workloads: (a) 32 chat prompts × 128 new tokens, (c) a single stream of 128 new
tokens, greedy with ``ignore_eos`` after an untimed warm-up; each variant runs
``--repeats`` times and the report keeps every figure and the median. llama-cpp-python
runs one sequence at a time, so its (a) is 32 streams one after the other.

Reported: tok/s, the ratio to bf16 and to llama.cpp, and each variant's weight bytes
(as stored) and KV blocks at the same ``--kv-cache-memory``.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from octavo import LLM
from octavo.model_executor.embedded import gguf_path
from octavo.model_executor.loader import weight_bytes
from octavo.model_executor.model_folders import load_tokenizer, resolve_model_folder
from octavo_bench import llama_cpp_baseline
from octavo_bench.engine_options import add_engine_options, default_dtype, threads_used
from octavo_bench.engine_runs import run_workload, warm_up
from octavo_bench.parsers import add_output_dir, register_subcommand
from octavo_bench.report import machine_info, ratio, save, table
from octavo_bench.workloads import Workload, build_workloads

WORKLOADS = ("a", "c")
OCTAVO_VARIANTS = {"bf16": None, "int8": "int8", "fp8": "fp8", "gguf": "gguf"}
LLAMA_CPP = "llama.cpp"
DEFAULT_VARIANTS = "bf16,int8,gguf,llama.cpp"


@dataclass
class VariantRun:
    variant: str
    workload: str
    tokens_per_s: list[float]  # one per repeat
    weight_bytes: int | None = None
    kv_blocks: int | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.tokens_per_s)


@dataclass
class QuantizedReport:
    dtype: str
    threads: int
    runs: list[VariantRun] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=machine_info)

    def median_of(self, variant: str, workload: str) -> float | None:
        found = [r.median for r in self.runs if r.variant == variant and r.workload == workload]
        return found[0] if found else None

    def versus(self, run: VariantRun, baseline: str) -> float | None:
        base = self.median_of(baseline, run.workload)
        return ratio(run.median, base) if base else None

    def to_json(self) -> dict[str, Any]:
        runs = [
            {
                **asdict(r),
                "median": r.median,
                "vs_bf16": self.versus(r, "bf16"),
                "vs_llama_cpp": self.versus(r, LLAMA_CPP),
            }
            for r in self.runs
        ]
        return {
            "dtype": self.dtype,
            "threads": self.threads,
            "runs": runs,
            "notes": self.notes,
            "machine": self.machine,
        }

    def text(self) -> str:
        rows = [
            [
                r.variant,
                r.workload,
                f"{r.median:.1f}",
                " / ".join(f"{v:.1f}" for v in r.tokens_per_s),
                _times(self.versus(r, "bf16")),
                _times(self.versus(r, LLAMA_CPP)),
                _mib(r.weight_bytes),
                "-" if r.kv_blocks is None else str(r.kv_blocks),
            ]
            for r in self.runs
        ]
        headers = [
            "variant",
            "workload",
            "median tok/s",
            "runs",
            "vs bf16",
            "vs llama.cpp",
            "weights MiB",
            "KV blocks",
        ]
        return "\n".join(
            [
                f"SmolLM2-135M ({self.dtype}, {self.threads} threads)",
                table(headers, rows),
                *self.notes,
            ]
        )

    def draw(self, plt: Any) -> Any:
        figure, axes = plt.subplots(1, len(WORKLOADS), figsize=(11, 4))
        for axis, workload in zip(axes, WORKLOADS, strict=True):
            runs = [r for r in self.runs if r.workload == workload]
            if not runs:
                continue
            bars = axis.bar([r.variant for r in runs], [r.median for r in runs])
            axis.bar_label(
                bars,
                [f"{r.median:.0f}\n{_times(self.versus(r, 'bf16'))} bf16" for r in runs],
                fontsize=8,
            )
            axis.set_ylim(0, 1.25 * max(r.median for r in runs))
            axis.set_title(f"workload {workload}: median output tok/s")
        return figure


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.1f}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--variants",
        default=DEFAULT_VARIANTS,
        help="comma-separated: bf16,int8,fp8,gguf,llama.cpp (default: %(default)s)",
    )
    parser.add_argument("--repeats", type=int, default=2, help="runs per variant (default: 2)")
    add_engine_options(
        parser, {"dtype": default_dtype(), "num_threads": None, "kv_cache_memory": 2**30}
    )
    parser.add_argument("--scale", type=float, default=1.0, help="shrink the workloads")
    llama_cpp_baseline.add_llama_cpp_arguments(parser)
    add_output_dir(parser, "quantized")


def register(kinds: argparse._SubParsersAction) -> None:
    register_subcommand(
        kinds,
        "quantized",
        "bf16 vs int8/fp8/GGUF kept quantized vs llama.cpp",
        __doc__,
        "",
        add_arguments,
        run,
    )


def run(args: argparse.Namespace) -> int:
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(variants) - {*OCTAVO_VARIANTS, LLAMA_CPP})
    if unknown:
        raise ValueError(f"unknown variants {unknown}; known: {[*OCTAVO_VARIANTS, LLAMA_CPP]}")
    folder = resolve_model_folder(None)
    workloads = build_workloads(load_tokenizer(folder), list(WORKLOADS), args.scale)
    threads = threads_used(args.num_threads)
    report = QuantizedReport(args.dtype, threads)
    for variant in variants:
        if variant == LLAMA_CPP:
            report.runs += run_llama_cpp(args, workloads, threads, report.notes)
        else:
            report.runs += run_octavo(folder, variant, args, workloads, threads)
    save(report, args.output_dir, "quantized")
    return 0


def run_octavo(
    folder: Path, variant: str, args, workloads: dict[str, Workload], threads: int
) -> list[VariantRun]:
    with LLM(
        str(folder),
        dtype=args.dtype,
        max_model_len=1024,
        num_threads=threads,
        kv_cache_memory=args.kv_cache_memory,
        quantization=OCTAVO_VARIANTS[variant],
    ) as llm:
        warm_up(llm, workloads["c"].prompts[0])
        footprint = weight_bytes(llm.engine.executor.worker.model)
        blocks = len(llm.engine.parts.pool.blocks)
        runs = []
        for name, workload in workloads.items():
            rates = [run_workload(llm, workload, f"{variant}").tok_s for _ in range(args.repeats)]
            runs.append(VariantRun(variant, name, rates, footprint, blocks))
        return runs


def run_llama_cpp(
    args, workloads: dict[str, Workload], threads: int, notes: list[str]
) -> list[VariantRun]:
    setup = llama_cpp_baseline.LlamaCppSetup.from_args(args)
    if setup.skipped:
        notes.append(f"llama.cpp skipped: {setup.skip_reason}")
        return []
    path = gguf_path()
    rates: dict[str, list[float]] = {name: [] for name in workloads}
    for _ in range(args.repeats):
        log = args.output_dir / "quantized-llama-cpp.log"
        for result in llama_cpp_baseline.run_offline(setup, path, workloads, log, threads):
            rates[result.workload].append(result.tok_s)
    notes.append("llama.cpp runs one sequence at a time: its (a) is 32 streams in a row")
    size = path.stat().st_size
    return [VariantRun(LLAMA_CPP, name, values, size) for name, values in rates.items() if values]
