"""`python -m octavo_bench cpu-linear`: a decoder step's linears (fp32 or bf16), native panel
kernel against oneDNN's prepacked GEMM.

One step of a model's linears (``--layers`` x q/k/v, o, gate/up and down, then the LM head;
default SmolLM2-135M's shapes), each layer with its own weights so that, as in a real step,
they stream from memory once per step, at each ``--rows`` count (decode batches up to
prefill chunks), on ``--num-threads`` threads, in ``--dtype``: the median ms per step of
the native ``dense_linear`` kernel on its column panels (what Octavo runs) and of oneDNN's
prepacked GEMM (``torch.ops.mkldnn._linear_pointwise``: what Octavo ran before, and what
vLLM's CPU build runs). Also the weights' GB/s and the GFLOP/s. bf16 runs the kernel's
AMX tiles, vdpbf16ps or widening path (the table names it: AMX where the CPU has it from 2
rows, vdpbf16ps on AMD's AVX512_BF16 and for 1 row on Intel's, else widened;
``OCTAVO_CPU_BF16_DOT=1`` or ``0`` holds the linears to vdpbf16ps or widening). With
``OCTAVO_CPU_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2`` both run their AVX2 code (an AVX2-only
machine, approximately). Writes ``cpu_linear.json`` and ``cpu_linear.png``.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field

import torch

from octavo.kernels.cpu_build import cpu_isa, native_op_owner
from octavo.model_executor.layers.dense_linear import dense_linear, pack_dense
from octavo.model_executor.layers.linear_method import can_pack
from octavo_bench.cpu_attention import timed_ms
from octavo_bench.parsers import add_output_dir, int_list, register_subcommand
from octavo_bench.report import machine_info, ratio, save, table


@dataclass
class StepShape:
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    layers: int
    element_bytes: int = 4

    def layer_matrices(self) -> list[tuple[int, int]]:
        """(out, in) of one layer's linears: q/k/v, o, gate/up, down."""
        qkv = (self.heads + 2 * self.kv_heads) * self.head_dim
        return [
            (qkv, self.hidden),
            (self.hidden, self.heads * self.head_dim),
            (2 * self.intermediate, self.hidden),
            (self.hidden, self.intermediate),
        ]

    def matrices(self) -> list[tuple[int, int]]:
        return self.layer_matrices() * self.layers + [(self.vocab, self.hidden)]

    @property
    def weight_bytes(self) -> int:
        return sum(self.element_bytes * out * inp for out, inp in self.matrices())


@dataclass
class RowsResult:
    rows: int
    panel_ms: float | None
    onednn_ms: float | None  # None: oneDNN does not run this dtype here
    weight_bytes: int
    element_bytes: int = 4
    panel_path: str = ""  # bf16: amx, vdpbf16ps or widened (the hidden size's inputs)

    @property
    def speedup(self) -> float | None:
        if self.panel_ms is None or self.onednn_ms is None:
            return None
        return ratio(self.onednn_ms, self.panel_ms)

    def gbps(self, ms: float | None) -> float | None:
        return None if ms is None else self.weight_bytes / ms / 1e6

    def gflops(self, ms: float | None) -> float | None:
        return (
            None
            if ms is None
            else 2 * self.rows * self.weight_bytes / self.element_bytes / ms / 1e6
        )


@dataclass
class LinearReport:
    settings: dict
    results: list[RowsResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    machine: dict = field(default_factory=machine_info)

    def to_json(self) -> dict:
        cases = [
            {
                **asdict(r),
                "speedup": r.speedup,
                "panel_gbps": r.gbps(r.panel_ms),
                "onednn_gbps": r.gbps(r.onednn_ms),
                "panel_gflops": r.gflops(r.panel_ms),
                "onednn_gflops": r.gflops(r.onednn_ms),
            }
            for r in self.results
        ]
        return {"settings": self.settings, "machine": self.machine, "cases": cases}

    def text(self) -> str:
        headers = [
            "rows",
            "panel path",
            "panel ms",
            "oneDNN ms",
            "oneDNN / panel",
            "GB/s (p/o)",
            "GFLOP/s (p/o)",
        ]
        body = [
            [
                str(r.rows),
                r.panel_path or "-",
                _number(r.panel_ms, 2),
                _number(r.onednn_ms, 2),
                "-" if r.speedup is None else f"{r.speedup:.2f}x",
                f"{_number(r.gbps(r.panel_ms), 0)}/{_number(r.gbps(r.onednn_ms), 0)}",
                f"{_number(r.gflops(r.panel_ms), 0)}/{_number(r.gflops(r.onednn_ms), 0)}",
            ]
            for r in self.results
        ]
        dtype = self.settings.get("dtype", "float32")
        title = f"== {dtype} linears of one decoder step: median ms per step =="
        return "\n".join([title, table(headers, body), *self.notes])

    def draw(self, plt):
        figure, axes = plt.subplots(figsize=(8, 4))
        rows = [r.rows for r in self.results]
        axes.plot(rows, [r.gbps(r.panel_ms) or 0 for r in self.results], "o-", label="panel kernel")
        onednn = [r.gbps(r.onednn_ms) or 0 for r in self.results]
        axes.plot(rows, onednn, "s-", label="oneDNN prepacked")
        axes.set_xscale("log", base=2)
        axes.set_xlabel("rows per step")
        axes.set_ylabel("weights read, GB/s (higher is faster)")
        axes.legend()
        figure.tight_layout()
        return figure


def build_step(
    shape: StepShape, panels: bool, dtype: torch.dtype
) -> list[tuple[torch.Tensor, int, int]]:
    """Each matrix of a step as (oneDNN-packed or panel-packed weight, out, in)."""
    generator = torch.Generator().manual_seed(0)
    ops = native_op_owner(torch.device("cpu"), "dense_linear") if panels else None
    step = []
    for out, inp in shape.matrices():
        weight = (torch.randn(out, inp, generator=generator) * inp**-0.5).to(dtype)
        if ops is not None:
            step.append((pack_dense(ops, weight), out, inp))
        else:
            step.append((torch.ops.mkldnn._reorder_linear_weight(weight, None), out, inp))
    return step


def step_ms(step, rows: int, panels: bool, repeats: int, dtype: torch.dtype) -> float:
    inputs = {inp: torch.randn(rows, inp).to(dtype) for _, _, inp in step}

    def run_step() -> None:
        for weight, out, inp in step:
            if panels:
                dense_linear(inputs[inp], weight, None, out)
            else:
                torch.ops.mkldnn._linear_pointwise(inputs[inp], weight, None, "none", [], "")

    return timed_ms(run_step, repeats)


def panel_path(rows: int, in_features: int) -> str:
    """Which way the bf16 panel kernel multiplies ``rows`` rows of ``in_features`` inputs."""
    return torch.ops.octavo_cpu.dense_bf16_path(rows, in_features)


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.num_threads)
    dtype = getattr(torch, args.dtype)
    shape = StepShape(
        args.hidden,
        args.intermediate,
        args.heads,
        args.kv_heads,
        args.head_dim,
        args.vocab,
        args.layers,
        dtype.itemsize,
    )
    settings = {key: str(value) for key, value in vars(args).items() if key != "func"}
    report = LinearReport({**settings, "octavo_isa": cpu_isa()})
    has_panels = native_op_owner(torch.device("cpu"), "dense_linear") is not None
    if not has_panels:
        report.notes.append("native kernels unavailable: oneDNN alone")
    onednn = build_step(shape, False, dtype) if can_pack(dtype, torch.device("cpu")) else None
    if onednn is None:
        report.notes.append(f"oneDNN does not run {args.dtype} here: the panel kernel alone")
    panel = build_step(shape, True, dtype) if has_panels else None
    for rows in args.rows:
        panel_ms = step_ms(panel, rows, True, args.repeats, dtype) if panel else None
        onednn_ms = step_ms(onednn, rows, False, args.repeats, dtype) if onednn else None
        path = panel_path(rows, args.hidden) if panel and dtype == torch.bfloat16 else ""
        report.results.append(
            RowsResult(rows, panel_ms, onednn_ms, shape.weight_bytes, dtype.itemsize, path)
        )
    save(report, args.output_dir, "cpu_linear")
    return 0


def _number(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int_list, default=[1, 2, 4, 8, 16, 32, 64, 256, 1024])
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--intermediate", type=int, default=1536)
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--num-threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=10, help="timed steps per row count")
    add_output_dir(parser, "cpu-linear")


def register(kinds: argparse._SubParsersAction) -> None:
    help_text = "linears of a decoder step: native panel kernel vs oneDNN"
    register_subcommand(kinds, "cpu-linear", help_text, __doc__, "", add_arguments, run)
