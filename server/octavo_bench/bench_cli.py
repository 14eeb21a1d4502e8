"""``octavo bench serve|throughput|latency``: the benchmarks under vLLM's names and flag
spellings (``vllm bench ...``), so a command written for vLLM runs against Octavo.

- ``serve`` is ``python -m octavo_bench serve`` against a running server; vLLM's spellings
  are translated (``--host``/``--port`` → ``--base-url``, ``--random-input-len`` →
  ``--input-len``, ``--random-output-len`` → ``--output-len``, ``--result-dir`` →
  ``--output-dir``; ``--save-result`` is accepted: results are always saved).
- ``throughput``: offline, ``--num-prompts`` random prompts of ``--input-len`` tokens each
  generating ``--output-len`` tokens (``ignore_eos``, sampled at temperature 1.0 as vLLM's
  requests are) in one ``LLM.generate``; prints
  vLLM's line ``Throughput: N requests/s, N total tokens/s, N output tokens/s``.
- ``latency``: one batch of ``--batch-size`` prompts (sampled as ``throughput``'s),
  ``--num-iters-warmup`` then ``--num-iters`` timed runs; prints ``Avg latency`` and the
  percentiles vLLM prints.

``--output-json`` writes the figures (vLLM's keys) to a file.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

from octavo_bench.sampling_choice import VLLM_BENCH

SERVE_SPELLINGS = {
    "--random-input-len": "--input-len",
    "--random-output-len": "--output-len",
    "--result-dir": "--output-dir",
}
LATENCY_PERCENTILES = (10, 25, 50, 75, 90, 99)


def serve_argv(argv: list[str]) -> list[str]:
    """vLLM's ``bench serve`` arguments in ``octavo_bench serve``'s spelling."""
    host, port, out = "127.0.0.1", None, []
    items = iter(argv)
    for item in items:
        name, equals, inline = item.partition("=")
        if name in ("--host", "--port"):
            value = inline if equals else next(items)
            host, port = (value, port) if name == "--host" else (host, value)
        elif name == "--save-result":
            continue  # octavo_bench always writes its JSON and PNG
        else:
            spelled = SERVE_SPELLINGS.get(name, name)
            out.append(f"{spelled}={inline}" if equals else spelled)
    if port is not None:
        out = ["--base-url", f"http://{host}:{port}", *out]
    return out


def random_prompts(count: int, length: int, vocab: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [
        {"prompt_token_ids": [rng.randrange(10, vocab) for _ in range(length)]}
        for _ in range(count)
    ]


def build_llm(args: argparse.Namespace):
    from octavo import LLM

    return LLM(
        args.model,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        enforce_eager=args.enforce_eager,
        load_format=args.load_format,
    )


def vllm_bench_params(output_len: int):
    """vLLM's ``bench throughput``/``latency`` requests: temperature 1.0, top-p 1.0, exactly
    ``output_len`` tokens (``ignore_eos``), so the figures compare as they stand."""
    from octavo import SamplingParams

    return SamplingParams(**VLLM_BENCH.fields(), max_tokens=output_len, ignore_eos=True)


def run_throughput(args: argparse.Namespace) -> int:
    llm = build_llm(args)
    vocab = min(llm.engine.vocab_size, 30000)
    prompts = random_prompts(args.num_prompts, args.input_len, vocab, args.seed)
    start = time.perf_counter()
    outputs = llm.generate(
        prompts, vllm_bench_params(args.output_len), use_tqdm=not args.disable_tqdm
    )
    elapsed = time.perf_counter() - start
    llm.shutdown()
    produced = sum(len(out.outputs[0].token_ids) for out in outputs)
    total = produced + args.num_prompts * args.input_len
    figures = {
        "elapsed_time": elapsed,
        "num_requests": args.num_prompts,
        "total_num_tokens": total,
        "requests_per_second": args.num_prompts / elapsed,
        "tokens_per_second": total / elapsed,
        "output_tokens_per_second": produced / elapsed,
    }
    print(
        f"Throughput: {figures['requests_per_second']:.2f} requests/s, "
        f"{figures['tokens_per_second']:.2f} total tokens/s, "
        f"{figures['output_tokens_per_second']:.2f} output tokens/s"
    )
    return write_json(args.output_json, figures)


def run_latency(args: argparse.Namespace) -> int:
    llm = build_llm(args)
    vocab = min(llm.engine.vocab_size, 30000)
    prompts = random_prompts(args.batch_size, args.input_len, vocab, args.seed)
    params = vllm_bench_params(args.output_len)

    def once() -> float:
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - start

    for _ in range(args.num_iters_warmup):
        once()
    latencies = np.array([once() for _ in range(args.num_iters)])
    llm.shutdown()
    percentiles = {str(p): float(np.percentile(latencies, p)) for p in LATENCY_PERCENTILES}
    print(f"Avg latency: {latencies.mean():.6f} seconds")
    for p, value in percentiles.items():
        print(f"{p}% percentile latency: {value:.6f} seconds")
    figures = {
        "avg_latency": float(latencies.mean()),
        "latencies": latencies.tolist(),
        "percentiles": percentiles,
    }
    return write_json(args.output_json, figures)


def write_json(path: Path | None, figures: dict) -> int:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(figures, indent=2) + "\n")
        print(f"wrote {path}")
    return 0


def run_serve(args: argparse.Namespace) -> int:
    from octavo_bench import serve

    return int(serve.main(serve_argv(args.serve_args)) or 0)


def _engine_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="model folder (or hf:// reference)")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--load-format", default="auto", choices=("auto", "dummy"))
    parser.add_argument("--input-len", type=int, default=128, help="prompt tokens")
    parser.add_argument("--output-len", type=int, default=128, help="generated tokens")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-json", type=Path, default=None, help="write the figures here")


def register(subparsers: argparse._SubParsersAction) -> None:
    bench = subparsers.add_parser("bench", help="benchmarks, as `vllm bench`", description=__doc__)
    kinds = bench.add_subparsers(dest="bench_command", required=True)
    serve = kinds.add_parser(
        "serve", help="online serving against a running server (octavo_bench serve)"
    )
    serve.add_argument("serve_args", nargs=argparse.REMAINDER, help="vLLM's bench serve flags")
    serve.set_defaults(func=run_serve)
    throughput = kinds.add_parser("throughput", help="offline throughput of random prompts")
    _engine_options(throughput)
    throughput.add_argument("--num-prompts", type=int, default=1000)
    throughput.add_argument("--disable-tqdm", action="store_true")
    throughput.set_defaults(func=run_throughput)
    latency = kinds.add_parser("latency", help="end-to-end latency of one batch")
    _engine_options(latency)
    latency.add_argument("--batch-size", type=int, default=8)
    latency.add_argument("--num-iters-warmup", type=int, default=10)
    latency.add_argument("--num-iters", type=int, default=30)
    latency.set_defaults(func=run_latency)


if __name__ == "__main__":
    from octavo.cli import main

    sys.exit(main(["bench", *sys.argv[1:]]))
