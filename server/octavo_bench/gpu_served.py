"""`octavo_bench gpu`'s ``served`` part: the vLLM paper's comparison, on the bench's device.

``octavo serve`` (the 1B folder, the bench's load format) and the naive HF server (one
request at a time, transformers' own KV cache, random weights where the folder has only a
config) answer the same ShareGPT-shaped requests (``sharegpt-synth``'s seeded file: the
paper's mean lengths, 161 in and 338 out) arriving as a seeded Poisson process, through
``python -m octavo_bench serve``; the figure is Octavo's output tok/s over HF's. HF is
serial, so its throughput does not depend on its queue: it gets only the first
``--served-hf-prompts`` requests. Octavo's figure is bounded by the offered load
(``--served-rate`` requests/s x 338 tokens), so the rate is reported beside it. The serve
report (serve.json, serve.png and both servers' logs) goes to ``--served-output-dir``
(default ``OUTPUT_DIR/served``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from octavo_bench import serve
from octavo_bench.gpu_report import mode_flags
from octavo_bench.report import HF, OCTAVO, ServeReport, save
from octavo_bench.sharegpt import MAX_TOTAL_LEN, synthesize

DATASET_CONVERSATIONS_PER_PROMPT = 2  # room for the pairs vLLM's length filter drops
STARTUP_TIMEOUT_S = 240  # a server not healthy by then fails the part, not the whole bench


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--served-prompts", type=int, default=200, help="requests to Octavo")
    parser.add_argument("--served-hf-prompts", type=int, default=4, help="requests to HF")
    parser.add_argument(
        "--served-rate", type=float, default=20.0, help="Poisson arrivals per second"
    )
    parser.add_argument(
        "--served-output-dir",
        type=Path,
        default=None,
        help="where the serve report and logs go (default: OUTPUT_DIR/served)",
    )
    parser.add_argument(
        "--served-output-len",
        type=int,
        default=None,
        help="tokens per request instead of the reply's length (quick runs)",
    )


def write_dataset(prompts: int) -> Path:
    """A seeded ShareGPT-shaped file (``sharegpt-synth``) with room for the length filter,
    in the temp dir (an input, the same every run: not a result)."""
    path = Path(tempfile.gettempdir()) / f"octavo-sharegpt-shaped-{prompts}.json"
    entries = synthesize(DATASET_CONVERSATIONS_PER_PROMPT * prompts, seed=0)
    path.write_text(json.dumps(entries))
    return path


def octavo_flags(args: argparse.Namespace, mode: str) -> list[str]:
    """``octavo serve`` flags beyond the model and dtype: the bench's device and weights."""
    flags = ["--device", args.device, "--max-model-len", str(MAX_TOTAL_LEN)]
    if args.load_format == "dummy":
        flags += ["--load-format", "dummy"]
    if args.kv_cache_memory:
        flags += ["--kv-cache-memory", str(args.kv_cache_memory)]
    flags += mode_flags(mode)
    return flags


def serve_argv(args: argparse.Namespace, mode: str, out: Path) -> list[str]:
    """``python -m octavo_bench serve`` arguments: one level holding every request."""
    hf_dtype = args.dtype if args.dtype in ("float32", "bfloat16") else "bfloat16"
    return [
        *("--launch", "--model-path", str(args.model), "--dtype", args.dtype),
        *("--serve-args", " ".join(octavo_flags(args, mode))),
        *("--dataset-name", "sharegpt", "--dataset-path", str(write_dataset(args.served_prompts))),
        *("--max-concurrency", str(args.served_prompts), "--num-prompts", str(args.served_prompts)),
        *("--request-rate", str(args.served_rate), "--seed", "0"),
        *("--startup-timeout", str(STARTUP_TIMEOUT_S)),
        *("--baseline", HF, "--baseline-dtype", hf_dtype, "--baseline-device", args.device),
        *("--baseline-num-prompts", str(args.served_hf_prompts)),
        *("--output-dir", str(out), "--disable-tqdm"),
        *(("--sharegpt-output-len", str(args.served_output_len)) if args.served_output_len else ()),
    ]


def figures_of(report: ServeReport, concurrency: int) -> dict[str, Any]:
    """Octavo's output tok/s, HF's, their ratio and both TTFT medians (None where missing)."""
    figures: dict[str, Any] = {}
    for label, prefix in ((OCTAVO, "served"), (HF, "served_hf")):
        run = report.run(label)
        level = run.level(concurrency) if run else None
        metrics = level.metrics if level else None
        figures[f"{prefix}_tok_s"] = metrics.output_throughput if metrics else None
        figures[f"{prefix}_failed"] = metrics.failed if metrics else None
        figures[f"{prefix}_ttft_p50_ms"] = metrics.ttft.median_ms if metrics else None
    figures["served_vs_hf"] = report.ratios(HF).get(concurrency)
    return figures


def served(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    """Both servers on the same requests; the figures for the bench's report."""
    out = args.served_output_dir or args.output_dir / "served"
    serve_args = serve.build_parser().parse_args(serve_argv(args, mode, out))
    report = serve.run_sweeps(serve_args)
    save(report, out, "serve")
    figures = figures_of(report, args.served_prompts)
    figures["served_request_rate"] = args.served_rate
    return figures
