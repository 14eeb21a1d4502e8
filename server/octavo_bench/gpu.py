"""`python -m octavo_bench gpu`: the GPU figures, in one run (what `make gpu-check` calls),
each for CUDA graphs (the default), for graphs with torch's FlashAttention-2 as the
attention kernels (``flash``: ``--attention-backend FLASH_ATTN --block-size 256``), for
graphs with ``--async-scheduling`` (the host plans step N+1 while the GPU runs step N;
vLLM's default) and for ``--enforce-eager``, one engine at a time.

Parts (``--parts``, all by default):

- ``b1``: decode at batch 1 on the 1B shape against the HBM roofline (a decode step must
  read every weight once, so ``weight bytes / memory bandwidth`` is the fastest a step can
  be; the bandwidth is measured here: a device-to-device copy, bytes read + written per
  second), and the GPU's own kernel time per step (torch.profiler), so that host overhead
  shows as the gap between the two;
- ``b32``: the decode step at batch 32 against batch 1, and 32 prompts x ``--max-tokens``
  in tok/s (``hf``: against HF transformers ``generate`` on the same folder, once);
- ``offline``, ``qwen3``: nano-vllm's bench.py shape (256 sequences, prompt and output
  lengths uniform in [100, 1024], random ids, ``ignore_eos``) on the 1B shape and on
  Qwen3-0.6B's shape (``--load-format dummy``);
- ``8b``: batch-1 decode on Llama-3.1-8B's shape with dummy weights (a config-only folder:
  no 16 GB checkpoint written) against its roofline;
- ``kernels``: each Triton kernel against the torch path (``gpu_kernels``; CUDA only);
- ``served``: the vLLM paper's comparison, ``octavo serve`` against a naive HF server (one
  request at a time) on ShareGPT-shaped requests with Poisson arrivals (``gpu_served``),
  in the first mode only (servers take a minute or two to measure).

A step's time is marginal: a run of ``--max-tokens`` minus a run of an eighth of them,
over the steps between (prefill and start-up cancel). ``--device cpu`` runs the same code
on the CPU (a smoke run; the kernel part is skipped with a note). Writes gpu.json, gpu.png.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from octavo.model_executor.load_formats import LOAD_FORMATS
from octavo_bench import gpu_served
from octavo_bench.baselines import HFBatch
from octavo_bench.gpu_measures import (
    OfflineShape,
    copy_bandwidth,
    decode_timing,
    free_device_memory,
    gpu_ms_per_step,
    hf_tok_s,
    offline_tok_s,
    prompts_of,
)
from octavo_bench.gpu_report import MODE_SETTINGS, MODES, GpuReport, number
from octavo_bench.parsers import add_output_dir, register_subcommand, standalone_parser
from octavo_bench.report import json_safe, save

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
PARTS = ("b1", "b32", "hf", "offline", "qwen3", "8b", "kernels", "served")
ONE_B_PARTS = frozenset({"b1", "b32", "offline"})  # the parts that run the 1B engine


@dataclass
class Bench:
    """One run: its arguments, its report, and the parts that failed (the rest still run)."""

    args: argparse.Namespace
    report: GpuReport
    started: float = field(default_factory=time.perf_counter)
    failures: int = 0

    @property
    def device(self) -> torch.device:
        return torch.device(self.args.device)

    def progress(self, message: str) -> None:
        print(f"[gpu {time.perf_counter() - self.started:6.1f}s] {message}", flush=True)

    def section(self, name: str, body: Callable[[], None]) -> None:
        """``body``, its failure noted (with a traceback) instead of ending the run."""
        self.progress(f"{name} ...")
        before = self.report.flat()
        try:
            body()
        except Exception as error:  # one failed part must not lose the others' figures
            traceback.print_exc()
            self.report.notes.append(f"{name} failed: {type(error).__name__}: {error}")
            self.failures += 1
        free_device_memory()
        self.write_json()
        held = torch.cuda.memory_reserved() / 2**30 if self.device.type == "cuda" else 0.0
        self.progress(f"{name} done ({held:.1f} GiB of GPU memory still reserved)")
        new = {key: value for key, value in self.report.flat().items() if key not in before}
        print("    " + ", ".join(f"{key} {number(value)}" for key, value in new.items()))

    def write_json(self) -> None:
        """gpu.json as it stands: a run cut short by its timeout keeps what it measured."""
        self.args.output_dir.mkdir(parents=True, exist_ok=True)
        text = json.dumps(json_safe(self.report.to_json()), indent=2, allow_nan=False)
        (self.args.output_dir / "gpu.json").write_text(text + "\n")


def with_engine(bench: Bench, folder: Path, mode: str, load_format: str, body) -> float:
    """Build an engine on ``folder`` in ``mode``, run ``body(llm)``, shut it down and free
    its device memory; returns the seconds the build took (load, profiling, capture)."""
    from octavo import LLM

    args = bench.args
    extra = {} if args.kv_cache_memory is None else {"kv_cache_memory": args.kv_cache_memory}
    start = time.perf_counter()
    llm = LLM(
        str(folder),
        dtype=args.dtype,
        device=args.device,
        max_model_len=args.max_model_len,
        load_format=load_format,
        **MODE_SETTINGS[mode],
        **extra,
    )
    build_s = time.perf_counter() - start
    try:
        body(llm)
    finally:
        llm.shutdown()
        del llm
        free_device_memory()
    return build_s


def roofline_ms(llm, bandwidth: float) -> tuple[int, float]:
    """The engine's weight bytes and the ms one pass over them takes at ``bandwidth``."""
    from octavo.model_executor.loader import weight_bytes

    weights = weight_bytes(llm.engine.executor.worker.model)
    return weights, 1000.0 * weights / bandwidth


def one_b(bench: Bench, mode: str, bandwidth: float) -> None:
    """The 1B engine's parts: batch 1 vs the roofline, batch 32 vs batch 1, nano-vllm."""
    args, parts, figures = bench.args, bench.args.parts, bench.report.figures[mode]

    def body(llm) -> None:
        weights, roofline = roofline_ms(llm, bandwidth)
        bench.report.common.update(weight_bytes=weights, roofline_ms_per_token=roofline)
        if "b1" in parts:
            single = decode_timing(llm, 1, args.prompt_len, args.max_tokens)
            figures["b1_ms_per_token"] = single.step_ms
            figures["b1_fraction_of_roofline"] = roofline / single.step_ms
            if mode == "eager":  # the profiler is the riskiest step: what came before is saved
                bench.write_json()
                figures["b1_gpu_ms_per_step"] = gpu_ms_per_step(llm, args.prompt_len)
        if "b32" in parts:
            batched = decode_timing(llm, args.batch, args.prompt_len, args.max_tokens)
            figures.update(b32_ms_per_step=batched.step_ms, b32_tok_s=batched.tok_s)
            if "b1_ms_per_token" in figures:
                figures["b32_step_over_b1"] = batched.step_ms / figures["b1_ms_per_token"]
        if "offline" in parts:
            bench.progress(f"1B {mode}: nano-vllm offline shape")
            figures["offline_1b_tok_s"] = offline_tok_s(llm, offline_shape(args))

    figures["start_1b_s"] = with_engine(bench, args.model, mode, args.load_format, body)


def qwen3(bench: Bench, mode: str) -> None:
    """nano-vllm's offline shape on Qwen3-0.6B's shape, dummy weights."""
    args, figures = bench.args, bench.report.figures[mode]

    def body(llm) -> None:
        figures["offline_qwen3_tok_s"] = offline_tok_s(llm, offline_shape(args))

    folder = args.model_qwen3 or preset_folder("qwen3-0.6b")
    figures["start_qwen3_s"] = with_engine(bench, folder, mode, "dummy", body)


def eight_b(bench: Bench, mode: str, bandwidth: float) -> None:
    """Batch-1 decode on Llama-3.1-8B's shape, dummy weights, against its roofline."""
    args, figures = bench.args, bench.report.figures[mode]

    def body(llm) -> None:
        weights, roofline = roofline_ms(llm, bandwidth)
        bench.report.common.update(weight_bytes_8b=weights, roofline_8b_ms_per_token=roofline)
        single = decode_timing(llm, 1, args.prompt_len, args.max_tokens)
        figures["b1_8b_ms_per_token"] = single.step_ms
        figures["b1_8b_fraction_of_roofline"] = roofline / single.step_ms
        if mode == "eager":
            bench.write_json()
            figures["b1_8b_gpu_ms_per_step"] = gpu_ms_per_step(llm, args.prompt_len)

    folder = args.model_8b or preset_folder("llama-8b")
    figures["start_8b_s"] = with_engine(bench, folder, mode, "dummy", body)


def offline_shape(args: argparse.Namespace) -> OfflineShape:
    return OfflineShape(args.offline_seqs, args.offline_min_len, args.offline_max_len)


def preset_folder(preset: str) -> Path:
    """A random-model preset's config-only folder under the temp dir (for dummy weights)."""
    from octavo_bench.random_model import build_random_model

    target = Path(tempfile.gettempdir()) / f"octavo-{preset}-config"
    return build_random_model(preset, target, config_only=True)


def hf_baseline(bench: Bench) -> None:
    """HF ``generate`` on the 1B folder: the same batch as ``b32``, once for both modes."""
    args = bench.args
    prompts = prompts_of(args.batch, args.prompt_len, 30000)
    batch = HFBatch(prompts, args.max_tokens, args.max_tokens * len(prompts))
    hf = hf_tok_s(args.model, DTYPES[args.dtype], bench.device, batch)
    bench.report.common["hf_b32_tok_s"] = hf
    compare_to_hf(bench.report)


def compare_to_hf(report: GpuReport) -> None:
    """Each mode's batch-32 tok/s over HF generate's (where both were measured)."""
    hf = report.common.get("hf_b32_tok_s")
    for figures in report.figures.values():
        if hf and "b32_tok_s" in figures:
            figures["b32_vs_hf"] = figures["b32_tok_s"] / hf


def served(bench: Bench, mode: str) -> None:
    figures = gpu_served.served(bench.args, mode)
    bench.report.figures[mode].update(figures)


def kernels(bench: Bench) -> None:
    if bench.device.type != "cuda":
        bench.report.notes.append(
            "kernels skipped: Triton kernels need CUDA (the unit tests check them on CPU "
            "under TRITON_INTERPRET=1)"
        )
        return
    from octavo_bench.gpu_kernels import all_kernels

    results = all_kernels(bench.device, DTYPES[bench.args.dtype])
    bench.report.kernels = [result.to_json() for result in results]


def measure(bench: Bench) -> None:
    args, report = bench.args, bench.report
    bandwidth = copy_bandwidth(bench.device, args.copy_bytes)
    report.common["copy_bandwidth_gb_s"] = bandwidth / 1e9
    if bench.device.type == "cuda":
        report.machine["gpu"] = torch.cuda.get_device_name(bench.device)
    first, *others = args.modes  # HF and the kernels before the second mode: the eager
    engine_parts(bench, first, bandwidth)  # runs are the slowest, a timeout takes them first
    if "hf" in args.parts:
        bench.section("HF generate", lambda: hf_baseline(bench))
    if "kernels" in args.parts:
        bench.section("kernels", lambda: kernels(bench))
    if "served" in args.parts:
        bench.section(f"served {first}", lambda: served(bench, first))
    for mode in others:
        engine_parts(bench, mode, bandwidth)
    compare_to_hf(report)
    report.notes.append(
        "ms per token/step: marginal decode steps (a run of --max-tokens minus a run of "
        "an eighth of them); GPU kernel ms: torch.profiler's CUDA kernels and copies, "
        "under --enforce-eager only (a graph replays the same kernels; the profiler around "
        "CUDA graph replays can crash the process: pytorch/pytorch#75504)"
    )


def engine_parts(bench: Bench, mode: str, bandwidth: float) -> None:
    """Every engine part of ``mode``, one engine at a time: 1B, Qwen3-0.6B, 8B."""
    parts = set(bench.args.parts)
    if ONE_B_PARTS & parts:
        bench.section(f"1B {mode}", lambda: one_b(bench, mode, bandwidth))
    if "qwen3" in parts:
        bench.section(f"Qwen3-0.6B {mode}", lambda: qwen3(bench, mode))
    if "8b" in parts:
        bench.section(f"8B {mode}", lambda: eight_b(bench, mode, bandwidth))


def names(allowed: tuple[str, ...]) -> Callable[[str], tuple[str, ...]]:
    """A comma-separated list of ``allowed`` names (argparse type)."""

    def parse(text: str) -> tuple[str, ...]:
        chosen = tuple(name.strip() for name in text.split(",") if name.strip())
        unknown = [name for name in chosen if name not in allowed]
        if unknown or not chosen:
            raise argparse.ArgumentTypeError(
                f"{text!r}: expected a comma-separated list of {', '.join(allowed)}"
            )
        return chosen

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        type=Path,
        default=None,
        help="the 1B model's folder (default: random-model llama-1b --config-only in the temp "
        "dir, loaded with dummy weights; HF generate gets random weights too)",
    )
    parser.add_argument(
        "--load-format",
        choices=LOAD_FORMATS,
        default=None,
        help="the 1B model's weights (default: auto with --model, else dummy)",
    )
    parser.add_argument("--model-8b", type=Path, default=None, help="default: llama-8b config")
    parser.add_argument("--model-qwen3", type=Path, default=None, help="default: qwen3-0.6b config")
    parser.add_argument("--parts", type=names(PARTS), default=PARTS, help=",".join(PARTS))
    parser.add_argument("--modes", type=names(MODES), default=MODES, help=",".join(MODES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--offline-seqs", type=int, default=256)
    parser.add_argument("--offline-min-len", type=int, default=100)
    parser.add_argument("--offline-max-len", type=int, default=1024)
    parser.add_argument("--copy-bytes", type=int, default=1 << 30, help="bandwidth probe size")
    parser.add_argument(
        "--kv-cache-memory", type=int, default=None, help="bytes (default: the engine's sizing)"
    )
    gpu_served.add_arguments(parser)
    add_output_dir(parser, "gpu")


def run(args: argparse.Namespace) -> int:
    if args.load_format is None:
        args.load_format = "dummy" if args.model is None else "auto"
    if args.model is None and ({"hf", "served"} | ONE_B_PARTS) & set(args.parts):
        args.model = preset_folder("llama-1b")
    report = GpuReport({key: str(value) for key, value in vars(args).items() if key != "func"})
    flash_refused = flash_mode_refused(args)
    if flash_refused and "flash" in args.modes:
        args.modes = tuple(mode for mode in args.modes if mode != "flash")
        report.notes.append(f"flash mode left out: {flash_refused}")
    bench = Bench(args, report)
    measure(bench)
    save(report, args.output_dir, "gpu")
    bench.progress(f"finished: {bench.failures} part(s) failed")
    return 1 if bench.failures else 0


def flash_mode_refused(args: argparse.Namespace) -> str | None:
    """Why the flash mode's engine cannot run here (the backend's own check); None where it
    can."""
    from octavo.attention.backend import check_backend

    block_size = MODE_SETTINGS["flash"]["block_size"]
    try:
        check_backend("FLASH_ATTN", torch.device(args.device), block_size, DTYPES[args.dtype])
    except ValueError as error:
        return str(error).removeprefix("attention_backend ")
    return None


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


def register(kinds: argparse._SubParsersAction) -> None:
    help_text = (
        "GPU figures, CUDA graphs, with FLASH_ATTN, with --async-scheduling and eager: "
        "decode vs the HBM roofline (1B, 8B), batch 32 vs 1 and vs HF, nano-vllm's offline "
        "shape, Triton vs torch, served vs HF"
    )
    register_subcommand(kinds, "gpu", help_text, __doc__, "", add_arguments, run)


def build_parser() -> argparse.ArgumentParser:
    return standalone_parser("gpu", __doc__, "", add_arguments)
