"""`python -m octavo_bench parallel`: one engine on 1 rank against tensor/pipeline layouts.

Each layout (``TPxPP``) runs the same offline workloads in one process tree, one layout
at a time: (a) 32 chat prompts × 128 new tokens and (c) a single stream of 128 tokens,
greedy with ``ignore_eos``, after an untimed warm-up. Reported per layout: tok/s, its
ratio to 1×1, steps, and the communication per step measured inside the workers
(all-reduce, logits gather, pipeline receive — the last includes waiting for the
previous stage). On a CPU the ranks share the same cores and memory bandwidth, so more
ranks are not faster; the figures show what the split costs. Every layout gets the
machine's CPUs shared out among its ranks (`--num-threads`), wherever they run.

A layout ``TPxPP@N`` spreads the ranks over N "hosts": the benchmark's engine is the
leader (node 0) and N - 1 ``octavo serve --headless`` processes on 127.0.0.1 join it over
TCP, as LeaderWorkerSet pods do (``worker_hosts.py``). Against the same ``TPxPP`` on one
host, the difference in ms per step is what the node channel costs: the step plan pickled
to every remote rank and the sampled tokens coming back over TCP (torch.distributed
between the ranks is TCP on loopback in both cases).

The default model is a random-weight model of SmolLM2's size with 8 attention heads
(``synthetic_model.py``), since SmolLM2's 9 heads do not split over 2 ranks; ``--model``
runs another folder (e.g. SmolLM2 with ``--layouts 1x1,3x1,1x2``).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from octavo import LLM
from octavo.cache_dirs import cache_root
from octavo.kernels.cpu_count import usable_cpus
from octavo.model_executor.model_folders import load_tokenizer, resolve_model_folder
from octavo_bench.engine_options import add_engine_options, default_dtype
from octavo_bench.engine_runs import greedy, warm_up
from octavo_bench.parsers import add_output_dir, register_subcommand
from octavo_bench.report import machine_info, ratio, save, table
from octavo_bench.synthetic_model import build_even_head_model
from octavo_bench.worker_hosts import worker_hosts
from octavo_bench.workloads import Workload, build_workloads

WORKLOADS = ("a", "c")
COMM_KINDS = ("all_reduce", "gather", "pipeline_receive")
DEFAULT_KV_BYTES = 2**30  # per worker


@dataclass(frozen=True)
class Layout:
    tensor: int
    pipeline: int
    nodes: int = 1

    @property
    def label(self) -> str:
        base = f"{self.tensor}x{self.pipeline}"
        return base if self.nodes == 1 else f"{base}@{self.nodes}"


@dataclass
class LayoutRun:
    layout: str  # "TPxPP" or "TPxPP@NODES"
    workload: str
    tokens_per_s: float
    steps: int
    comm_ms_per_step: dict[str, float]  # the busiest worker's, per kind
    ms_per_step: float = 0.0  # wall time of one engine step, as the leader sees it


@dataclass
class ParallelReport:
    model: str
    dtype: str
    runs: list[LayoutRun] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=machine_info)

    def baseline(self, workload: str) -> float | None:
        rates = [r.tokens_per_s for r in self.runs if r.workload == workload and r.layout == "1x1"]
        return rates[0] if rates else None

    def to_json(self) -> dict[str, Any]:
        runs = [
            {**asdict(r), "vs_1x1": ratio(r.tokens_per_s, self.baseline(r.workload) or 0)}
            for r in self.runs
        ]
        return {
            "model": self.model,
            "dtype": self.dtype,
            "runs": runs,
            "notes": self.notes,
            "machine": self.machine,
        }

    def text(self) -> str:
        rows = []
        for r in self.runs:
            base = self.baseline(r.workload)
            versus = ratio(r.tokens_per_s, base) if base else None
            comm = [f"{r.comm_ms_per_step.get(kind, 0.0):.2f}" for kind in COMM_KINDS]
            shown = "-" if versus is None else f"{versus:.2f}x"
            figures = [f"{r.tokens_per_s:.1f}", shown, str(r.steps), f"{r.ms_per_step:.2f}"]
            rows.append([r.layout, r.workload, *figures, *comm])
        headers = [
            "TPxPP",
            "workload",
            "tok/s",
            "vs 1x1",
            "steps",
            "ms/step",
            "all-reduce ms/step",
            "gather ms/step",
            "pipeline recv ms/step",
        ]
        return "\n".join([f"{self.model} ({self.dtype})", table(headers, rows), *self.notes])

    def draw(self, plt: Any) -> Any:
        """Bars of tok/s per layout, labelled with the ratio to 1×1 and communication/step."""
        figure, axes = plt.subplots(1, len(WORKLOADS), figsize=(10, 4))
        for axis, workload in zip(axes, WORKLOADS, strict=True):
            runs = [r for r in self.runs if r.workload == workload]
            bars = axis.bar([r.layout for r in runs], [r.tokens_per_s for r in runs])
            base = self.baseline(workload) or 0
            labels = [
                f"{ratio(r.tokens_per_s, base) or 0:.2f}x\n"
                f"comm {sum(r.comm_ms_per_step.values()):.1f} ms/step"
                for r in runs
            ]
            axis.bar_label(bars, labels, fontsize=8)
            axis.set_ylim(0, 1.2 * max(r.tokens_per_s for r in runs))
            axis.set_title(f"workload {workload}: output tok/s by TPxPP")
            axis.set_ylabel("output tok/s")
        return figure


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", default=None, help="local HF model folder (default: SmolLM2-sized, 8 heads)"
    )
    parser.add_argument(
        "--layouts",
        default="1x1,2x1,1x2",
        help="comma-separated TPxPP layouts, TPxPP@N over N local 'hosts' (leader + "
        "N-1 --headless processes), e.g. 1x1,1x2,1x2@2 (default: %(default)s)",
    )
    add_engine_options(parser, {"dtype": default_dtype(), "kv_cache_memory": DEFAULT_KV_BYTES})
    parser.add_argument("--scale", type=float, default=1.0, help="shrink the workloads")
    add_output_dir(parser, "parallel")


def register(kinds: argparse._SubParsersAction) -> None:
    register_subcommand(
        kinds, "parallel", "1 rank vs tensor/pipeline layouts", __doc__, "", add_arguments, run
    )


def parse_layouts(text: str) -> list[Layout]:
    return [parse_layout(item.strip()) for item in text.split(",")]


def parse_layout(item: str) -> Layout:
    ranks, _, nodes = item.partition("@")
    tensor, _, pipeline = ranks.partition("x")
    numbers = (tensor, pipeline, nodes or "1")
    if not all(n.isdigit() and int(n) > 0 for n in numbers):
        raise ValueError(f"layout {item!r} is not TPxPP or TPxPP@NODES, e.g. 2x1 or 1x2@2")
    layout = Layout(int(tensor), int(pipeline), int(numbers[2]))
    if (layout.tensor * layout.pipeline) % layout.nodes:
        raise ValueError(f"layout {item!r}: the nodes must divide TP x PP")
    return layout


def run(args: argparse.Namespace) -> int:
    layouts = parse_layouts(args.layouts)
    folder = Path(args.model) if args.model else default_model()
    workloads = build_workloads(load_tokenizer(folder), list(WORKLOADS), args.scale)
    report = ParallelReport(str(folder), args.dtype)
    for layout in layouts:
        report.runs += run_layout(
            folder, layout, args.dtype, workloads, args.output_dir, args.kv_cache_memory
        )
    save(report, args.output_dir, "parallel")
    return 0


def default_model() -> Path:
    """SmolLM2's size with 8 heads (random weights), built once into the cache."""
    target = cache_root() / "bench-models" / "smollm2-size-8-heads"
    return build_even_head_model(resolve_model_folder(None), target)


def run_layout(
    folder: Path,
    layout: Layout,
    dtype: str,
    workloads: dict[str, Workload],
    output_dir: Path,
    kv_cache_memory: int = DEFAULT_KV_BYTES,
) -> list[LayoutRun]:
    settings = {
        "dtype": dtype,
        "max_model_len": 1024,
        "kv_cache_memory": kv_cache_memory,
        "tensor_parallel_size": layout.tensor,
        "pipeline_parallel_size": layout.pipeline,
        # this machine's CPUs shared out among every rank, whichever "host" runs it
        "num_threads": max(1, usable_cpus() // (layout.tensor * layout.pipeline)),
    }
    if layout.nodes == 1:
        return run_engine(folder, layout, settings, workloads)
    flags = [f"--{name.replace('_', '-')}={value}" for name, value in settings.items()]
    log_dir = output_dir / f"hosts-{layout.label}"
    with worker_hosts(folder, layout.nodes, flags, log_dir) as group:
        return run_engine(folder, layout, {**settings, **group.engine_kwargs()}, workloads)


def run_engine(
    folder: Path, layout: Layout, settings: dict[str, object], workloads: dict[str, Workload]
) -> list[LayoutRun]:
    with LLM(str(folder), **settings) as llm:
        warm_up(llm, workloads["c"].prompts[0])
        return [timed_run(llm, layout.label, w) for w in workloads.values()]


def timed_run(llm: LLM, layout: str, workload: Workload) -> LayoutRun:
    engine = llm.engine
    communication_stats(llm)  # start from zero
    pairs = zip(workload.prompts, workload.max_tokens, strict=True)
    for index, (prompt, count) in enumerate(pairs):
        engine.add_request(f"parallel-{layout}-{workload.name}-{index}", prompt, greedy(count))
    steps, generated, start = 0, 0, time.perf_counter()
    while engine.has_unfinished_requests():
        generated += sum(len(o.outputs[0].token_ids) for o in engine.step() if o.finished)
        steps += 1
    wall = time.perf_counter() - start
    per_step = {kind: 1000 * seconds / steps for kind, seconds in communication_stats(llm).items()}
    print(f"{layout} {workload.name}: {generated / wall:.1f} tok/s, {steps} steps")
    return LayoutRun(layout, workload.name, generated / wall, steps, per_step, 1000 * wall / steps)


def communication_stats(llm: LLM) -> dict[str, float]:
    """Seconds per kind of the busiest worker (none with one rank in-process)."""
    executor = llm.engine.executor
    if not hasattr(executor, "call"):
        return {}
    busiest: dict[str, float] = {}
    for stats in executor.call("communication_stats"):
        for kind, (seconds, _calls) in stats.items():
            busiest[kind] = max(busiest.get(kind, 0.0), seconds)
    return busiest
