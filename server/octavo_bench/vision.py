"""`python -m octavo_bench vision`: image requests through Octavo, HF and vLLM.

One model folder, three engines, one run: Octavo's offline ``LLM.generate`` with
``multi_modal_data``, HF ``generate`` and vLLM's CPU build (its own venv). Workloads
(defaults; ``--quick`` shrinks them), all greedy with ``ignore_eos``, after an untimed
warm-up on every engine:
  1 image            16 requests of one distinct image, 16 new tokens: requests/s
  4 images           8 requests of four distinct images, 16 new tokens: requests/s
  1 image, repeated  as "1 image" with one image in every request (the encoder cache)
  TTFT 1 / 4 images  5 requests each, one at a time, max_tokens 1: median wall time
Default model: a random-weight Qwen2.5-VL folder written by the benchmark (6-layer
decoder of hidden 512, 4-block vision tower; 336x336 images = 144 placeholder tokens).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from octavo import LLM
from octavo_bench.engine_options import add_engine_options, default_dtype, threads_used
from octavo_bench.parsers import add_engines_option, add_output_dir, register_subcommand
from octavo_bench.report import HF, OCTAVO, VLLM, machine_info, save
from octavo_bench.vision_engines import run_hf, run_octavo
from octavo_bench.vision_model import IMAGE_PLACEHOLDER, build_qwen2_5_vl
from octavo_bench.vision_report import ENGINES, VisionReport
from octavo_bench.vision_vllm import MAX_IMAGES_PER_PROMPT, run_vllm
from octavo_bench.vision_workloads import (
    REPEATED,
    ImageDraw,
    VisionWorkload,
    WorkloadSizes,
    vision_workloads,
    warmup_workload,
)
from octavo_bench.vllm_baseline import VllmRunError, VllmSetup, add_vllm_arguments

QUICK = WorkloadSizes(one_image_requests=2, four_image_requests=1, ttft_repeats=1, max_tokens=4)
DEFAULT_KV_CACHE_MEMORY = 512 * 1024**2
BIND = "VLLM_CPU_OMP_THREADS_BIND"
RANDOM_MODEL = "vision-qwen2_5_vl-random"  # the default folder, under --output-dir
METHOD = (
    "throughput: a workload's requests in one generate call (Octavo, vLLM), one at a time "
    "(HF); TTFT: each request alone, max_tokens 1, wall time incl. the HF processor; "
    "prefix caching off (Octavo, vLLM); HF has no encoder cache and skips the repeated run"
)

EPILOG = """\
Throughput: Octavo and vLLM take a workload's requests in one generate call (one batch);
HF runs them one at a time (batched generate with images needs padded pixel_values and
left padding the Qwen2.5-VL processor does not do). TTFT: each request alone, max_tokens
1, the wall time of the call, HF processor included on every engine. Octavo and vLLM
run with prefix caching off and every prompt starts with its own request number, so the
repeated workload measures the encoder cache (vLLM's also its processor cache). HF has
no encoder cache and skips it. --num-threads N gives every engine N threads (vLLM: the
first N CPUs, unless VLLM_CPU_OMP_THREADS_BIND is set); on a busy machine one thread each
is far steadier than OpenMP threads that wait for each other. vLLM: --vllm-python or
.venv-vllm (`make vllm-venv`), its log in OUTPUT_DIR/vision-vllm.log; with no vLLM the
report notes why.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=None,
        help=f"model folder (default: a random Qwen2.5-VL written to OUTPUT_DIR/{RANDOM_MODEL})",
    )
    parser.add_argument(
        "--image-placeholder",
        default=IMAGE_PLACEHOLDER,
        help="one image's text in a prompt (default: Qwen-VL's, %(default)s)",
    )
    add_engines_option(parser, ENGINES)
    add_size_arguments(parser)
    add_engine_options(
        parser,
        {
            "dtype": default_dtype(),
            "max_model_len": 2048,
            "kv_cache_memory": DEFAULT_KV_CACHE_MEMORY,
            "num_threads": None,
        },
    )
    add_vllm_arguments(parser)
    add_output_dir(parser, "vision")


def add_size_arguments(parser: argparse.ArgumentParser) -> None:
    sizes = WorkloadSizes()
    parser.add_argument("--one-image-requests", type=int, default=sizes.one_image_requests)
    parser.add_argument("--four-image-requests", type=int, default=sizes.four_image_requests)
    parser.add_argument("--ttft-repeats", type=int, default=sizes.ttft_repeats)
    parser.add_argument("--max-tokens", type=int, default=sizes.max_tokens)
    parser.add_argument("--image-size", type=int, default=sizes.image_size, help="square, px")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 2 one-image requests, 1 four-image, 1 TTFT repeat, 4 tokens",
    )


def register(kinds: argparse._SubParsersAction) -> None:
    register_subcommand(
        kinds,
        "vision",
        "image requests/s and TTFT vs HF generate and vLLM",
        __doc__,
        EPILOG,
        add_arguments,
        run,
    )


def workload_sizes(args: argparse.Namespace) -> WorkloadSizes:
    if args.quick:
        return WorkloadSizes(**{**vars(QUICK), "image_size": args.image_size})
    sizes = WorkloadSizes(
        args.one_image_requests,
        args.four_image_requests,
        args.ttft_repeats,
        args.max_tokens,
        args.image_size,
    )
    counts = [value for value in vars(sizes).values() if isinstance(value, int)]
    if min(counts) < 1:
        raise ValueError("request counts, --max-tokens and --image-size must be >= 1")
    return sizes


def run(args: argparse.Namespace) -> int:
    vllm = VllmSetup.from_args(args) if VLLM in args.engines else None
    if vllm is not None and vllm.python is None and args.vllm_python:
        raise ValueError(vllm.skip_reason)  # a wrong path: say so before the long runs
    if vllm is not None and args.num_threads and BIND not in os.environ:
        vllm.env[BIND] = first_cpus(args.num_threads)  # as many threads as the others
    torch.set_num_threads(threads_used(args.num_threads))
    folder = model_folder(args)
    sizes = workload_sizes(args)
    sizes.placeholder = args.image_placeholder
    draw = ImageDraw(sizes.image_size)
    workloads, warmup = vision_workloads(sizes, draw), warmup_workload(draw, sizes.placeholder)
    report = VisionReport(bench_machine(args.dtype), run_config(args, folder, sizes))
    report.notes.append(METHOD)
    if OCTAVO in args.engines:
        note_load(report, OCTAVO)
        run_octavo_side(args, folder, workloads, warmup, report)
    if HF in args.engines:
        note_load(report, HF)
        chosen = [w for w in workloads if w.name != REPEATED]
        report.results += run_hf(folder, args.dtype, chosen, warmup)
    if vllm is not None:
        note_load(report, VLLM)
        run_vllm_side(args, folder, workloads, warmup, report, vllm)
    note_load(report, "end")
    save(report, args.output_dir, "vision")
    return 0


def note_load(report: VisionReport, when: str) -> None:
    """The 1-minute load average as each engine starts (a shared machine's noise)."""
    load = round(os.getloadavg()[0], 2)
    report.config.setdefault("load_average_1min", {})[when] = load
    print(f"load average before {when}: {load}", flush=True)


def first_cpus(count: int) -> str:
    """The first ``count`` CPUs this process may use, as vLLM's ``0,1`` lists."""
    return ",".join(str(cpu) for cpu in sorted(os.sched_getaffinity(0))[:count])


def model_folder(args: argparse.Namespace) -> Path:
    if args.model:
        return Path(args.model)
    target = args.output_dir / RANDOM_MODEL
    print(f"random Qwen2.5-VL model: {target}", flush=True)
    return build_qwen2_5_vl(target)


def bench_machine(dtype: str) -> dict:
    import transformers

    return machine_info(
        torch_threads=torch.get_num_threads(),
        torch_version=torch.__version__,
        transformers_version=transformers.__version__,
        dtype=dtype,
    )


def run_config(args: argparse.Namespace, folder: Path, sizes: WorkloadSizes) -> dict:
    return {
        "model": args.model or "random Qwen2.5-VL",
        "model_folder": str(folder),
        "engines": args.engines,
        "sizes": vars(sizes),
        "max_model_len": args.max_model_len,
        "kv_cache_memory": args.kv_cache_memory,
        "num_threads": threads_used(args.num_threads),
        "prefix_caching": False,
    }


def run_octavo_side(
    args: argparse.Namespace,
    folder: Path,
    workloads: list[VisionWorkload],
    warmup: VisionWorkload,
    report: VisionReport,
) -> None:
    with LLM(
        str(folder),
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        kv_cache_memory=args.kv_cache_memory,
        enable_prefix_caching=False,
        num_threads=args.num_threads,
        limit_mm_per_prompt={"image": MAX_IMAGES_PER_PROMPT},
    ) as llm:
        results, report.encoder_cache = run_octavo(llm, workloads, warmup)
    report.results += results


def run_vllm_side(
    args: argparse.Namespace,
    folder: Path,
    workloads: list[VisionWorkload],
    warmup: VisionWorkload,
    report: VisionReport,
    vllm: VllmSetup,
) -> None:
    """vLLM on every workload; a note instead when it cannot run."""
    if vllm.python is not None:
        log = args.output_dir / "vision-vllm.log"
        try:
            report.results += run_vllm(vllm, folder, args.max_model_len, workloads, warmup, log)
        except VllmRunError as error:
            vllm.skip_reason = str(error)
    report.config[VLLM] = vllm.describe()
    if vllm.skip_reason:
        message = f"vllm skipped: {vllm.skip_reason}"
        print(message, file=sys.stderr)
        report.notes.append(message)
