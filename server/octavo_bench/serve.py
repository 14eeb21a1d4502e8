"""`python -m octavo_bench serve`: an online benchmark of any OpenAI-compatible server.

Streams seeded synthetic requests to BASE_URL (Octavo, vLLM, llama.cpp server, ...) at
each concurrency level of a sweep and reports what `vllm bench serve` reports per level:
successful/failed requests, duration, request and token throughputs, and TTFT, TPOT,
ITL and end-to-end latency (mean, median, p99). `--launch` starts `octavo serve` itself;
`--baseline hf` also measures a naive HF transformers server (one request at a time) and
`--baseline vllm` vLLM's OpenAI server (its CPU build, from its own venv) with the same
client and prompts, and prints Octavo's output tok/s over each baseline's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from octavo.arg_types import positive_int
from octavo_bench.parsers import (
    PROG,
    add_output_dir,
    int_list,
    name_list,
    register_subcommand,
    standalone_parser,
)
from octavo_bench.report import HF, OCTAVO, VLLM, LevelResult, ServeReport, ServerRun, save
from octavo_bench.sampling_choice import add_sampling_arguments, sampling_from_args
from octavo_bench.serve_client import (
    ClientOptions,
    Target,
    fetch_model_id,
    fetch_models,
    run_level,
)
from octavo_bench.serve_launch import (
    ChildServer,
    LaunchError,
    child_server,
    free_port,
    hf_server_command,
    octavo_serve_command,
    vllm_server_command,
)
from octavo_bench.serve_metrics import level_metrics
from octavo_bench.serve_server_stats import watching
from octavo_bench.serve_vllm_client import ClientLoad, client_arguments, run_vllm_client
from octavo_bench.serve_workload import (
    LengthRange,
    PromptSpec,
    arrival_times,
    build_prompts,
    level_seed,
    parse_length,
)
from octavo_bench.sharegpt import sample_sharegpt, token_counter
from octavo_bench.vllm_baseline import VllmSetup, add_vllm_arguments

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
DEFAULT_SWEEP = "1,5,10,20"
BASELINES = (HF, VLLM)
MIN_PROMPTS = 4
WARMUP = PromptSpec("Say hello.", 3, 4)

EPILOG = """\
Prompts are random sequences of common English words (about one token each), seeded per
concurrency level, so every server sees the same requests whatever its tokenizer; prompt
and output token counts come from the server's usage (stream_options.include_usage).
Each request asks for max_tokens, greedy (temperature 0) unless --temperature (with
--top-p, --top-k, --min-p, as vllm bench serve spells them) makes it sample, and, unless
--no-ignore-eos, ignore_eos so it runs to its full length; vLLM's own client
(--vllm-client) is given the same sampling flags. An untimed warm-up request precedes each sweep.
With --baseline, one server is up at a time: the target runs every level and stops,
then each baseline (a resident second server, vLLM's ~6 GB, skewed the first's figures
on the 2-core machine: TTFT p50 at 20 users 440 ms alone, 880 ms beside an idle vLLM).
--no-one-at-a-time keeps all up and alternates the levels (target at 1 user, baseline
at 1 user, target at 5, ...) so that drifts in machine load hit all alike.
--baseline-num-prompts N sends the serial hf baseline only N per level (vllm, a
concurrent server, always gets every prompt).

--baseline vllm runs `<python> -m vllm.entrypoints.openai.api_server` with the python
of vLLM's venv (--vllm-python, else .venv-vllm/bin/python, made by `make vllm-venv`;
without one the report notes it skipped and why) on the baseline model folder, serving
it under the target's model name, with the target's max_model_len (from its /v1/models,
or --max-model-len) and --vllm-dtype. Unless set, VLLM_CPU_OMP_THREADS_BIND binds every
CPU, VLLM_CPU_NUM_OF_RESERVED_CPU=0 and VLLM_CPU_KVCACHE_SPACE=4 (GiB). A cold vLLM
start takes minutes (--vllm-startup-timeout, default 900 s).

TTFT: send to first chunk with text. TPOT: (latency - TTFT) / (output tokens - 1), over
requests with more than one token. ITL: gaps between text chunks, pooled over requests.
E2EL: send to end of stream. Throughputs: totals of successful requests / level wall time.

vLLM's classic serving benchmark (benchmark_serving.py --dataset-name sharegpt
--request-rate 10): --dataset-name sharegpt --dataset-path FILE draws requests as vLLM
does (prompt = first turn, max_tokens = the reply's length in tokens of --tokenizer; its
length filter); `python -m octavo_bench sharegpt-synth FILE` writes a ShareGPT-shaped
file where the real one cannot be downloaded. During each level /metrics is read every
0.25 s: the largest batch the server ran (vllm:num_requests_running) and its peak KV cache
use (vllm:kv_cache_usage_perc) go into the serving table, a column per server.
--vllm-client also runs vLLM's own client at each level (same dataset, rate, concurrency,
prompts, seed, ignore_eos) against the same server, and adds its figures to the table.

Results go to OUTPUT_DIR/serve.json (settings, per-level figures, every request's TTFT,
ITLs, lengths and errors) and OUTPUT_DIR/serve.png; launched servers log to
OUTPUT_DIR/serve-<name>.log. Example, one command for Octavo against both baselines:
  python -m octavo_bench serve --launch --baseline hf,vllm --output-len 64
and the ShareGPT-shaped run with both clients:
  python -m octavo_bench sharegpt-synth bench-results/sharegpt-synthetic.json
  python -m octavo_bench serve --launch --baseline hf,vllm --vllm-client --endpoint completions \
      --dataset-name sharegpt --dataset-path bench-results/sharegpt-synthetic.json \
      --max-concurrency 64 --num-prompts 100 --request-rate 1 --baseline-num-prompts 8
"""


def json_object(text: str) -> dict[str, Any]:
    """An argparse type: a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not JSON: {error}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def request_rate(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 or inf, got {text!r}")
    return value


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--base-url", default=None, help=f"server to measure (default: {DEFAULT_BASE_URL})"
    )
    where.add_argument(
        "--launch",
        action="store_true",
        help="start `octavo serve` on a free loopback port, measure it, stop it (SIGTERM)",
    )
    parser.add_argument("--model-path", default=None, help="--launch: model folder to serve")
    parser.add_argument("--dtype", default=None, help="--launch: passed to `octavo serve --dtype`")
    parser.add_argument(
        "--serve-args", default="", help="--launch: more `octavo serve` flags, one quoted string"
    )
    parser.add_argument(
        "--startup-timeout",
        type=float,
        default=600.0,
        help="seconds to wait for launched servers (vLLM: --vllm-startup-timeout)",
    )
    parser.add_argument("--model", default=None, help="model name (default: first /v1/models id)")
    parser.add_argument("--endpoint", choices=("chat", "completions"), default="chat")
    parser.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    parser.add_argument("--label", default=OCTAVO, help="name of the measured server in reports")


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    levels = parser.add_mutually_exclusive_group()
    levels.add_argument(
        "--concurrency-sweep",
        type=int_list,
        default=int_list(DEFAULT_SWEEP),
        help=f"concurrency levels, each with its own requests (default: {DEFAULT_SWEEP})",
    )
    levels.add_argument(
        "--max-concurrency", type=positive_int, default=None, help="a single level of N users"
    )
    parser.add_argument(
        "--num-prompts",
        type=positive_int,
        default=None,
        help=f"requests per level (default: 2 x concurrency, at least {MIN_PROMPTS})",
    )
    parser.add_argument(
        "--request-rate",
        type=request_rate,
        default=math.inf,
        help="Poisson arrivals per second, seeded (default: inf = all at once)",
    )
    parser.add_argument(
        "--dataset-name",
        choices=("random", "sharegpt"),
        default="random",
        help="random: seeded word prompts of --input-len/--output-len; sharegpt: requests "
        "drawn from --dataset-path as vLLM's benchmark draws them",
    )
    parser.add_argument(
        "--dataset-path", type=Path, default=None, help="a ShareGPT-format JSON file"
    )
    parser.add_argument(
        "--sharegpt-output-len",
        type=positive_int,
        default=None,
        help="sharegpt: this many output tokens per request instead of the reply's length",
    )
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="sharegpt: tokenizer folder for the lengths (default: --model-path, else the "
        "baseline model, else the embedded SmolLM2)",
    )
    parser.add_argument(
        "--input-len", type=parse_length, default=parse_length("128"), help="words, N or LO:HI"
    )
    parser.add_argument(
        "--output-len", type=parse_length, default=parse_length("128"), help="tokens, N or LO:HI"
    )
    parser.add_argument("--seed", type=int, default=0, help="prompts and arrivals seed")
    parser.add_argument(
        "--ignore-eos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="send ignore_eos so every request yields max_tokens tokens (default: on)",
    )
    add_sampling_arguments(parser)
    parser.add_argument("--timeout", type=float, default=600.0, help="per-request timeout (s)")
    parser.add_argument("--disable-tqdm", action="store_true", help="no progress bars")
    parser.add_argument(
        "--extra-body",
        type=json_object,
        default={},
        help="a JSON object merged into every request, e.g. '{\"guided_json\": {...}}' to "
        "measure structured output",
    )


def add_baseline_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--baseline",
        type=name_list(BASELINES),
        default=[],
        help="also measure, comma-separated: hf (a naive HF transformers server, one request "
        "at a time), vllm (vLLM's OpenAI server from its own venv)",
    )
    parser.add_argument(
        "--baseline-model",
        default=None,
        help="baseline model folder (default: --model-path, else the embedded SmolLM2)",
    )
    parser.add_argument(
        "--baseline-dtype", choices=("float32", "bfloat16"), default="float32", help="HF dtype"
    )
    parser.add_argument(
        "--baseline-device", default="cpu", help="where the hf baseline runs (cpu, cuda)"
    )
    parser.add_argument(
        "--baseline-num-prompts",
        type=positive_int,
        default=None,
        help="the hf baseline sends only the first N prompts of each level (it is serial)",
    )
    parser.add_argument(
        "--one-at-a-time",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="one server up at a time (default); --no-one-at-a-time alternates levels",
    )
    add_vllm_arguments(parser)
    parser.add_argument(
        "--vllm-client",
        action="store_true",
        help="after each level, also run vLLM's own client (vllm bench serve, from vLLM's "
        "venv) against the same server at the same load, and report its figures",
    )
    parser.add_argument(
        "--vllm-startup-timeout",
        type=float,
        default=900.0,
        help="seconds to wait for vLLM's server to be healthy (default: %(default)s)",
    )
    parser.add_argument(
        "--max-model-len",
        type=positive_int,
        default=None,
        help="vLLM's max_model_len, and --launch's (default: the target's, from /v1/models)",
    )
    add_output_dir(parser, "serve")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)
    add_load_arguments(parser)
    add_baseline_arguments(parser)


def register(kinds: argparse._SubParsersAction) -> None:
    help_text = "online serving benchmark against an OpenAI-compatible server"
    register_subcommand(kinds, "serve", help_text, __doc__, EPILOG, add_arguments, run)


def build_parser() -> argparse.ArgumentParser:
    return standalone_parser("serve", __doc__, EPILOG, add_arguments)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark from command-line arguments (what the tests call)."""
    return run(build_parser().parse_args(argv))


def concurrency_levels(args: argparse.Namespace) -> list[int]:
    return [args.max_concurrency] if args.max_concurrency else list(args.concurrency_sweep)


def prompts_for(args: argparse.Namespace, concurrency: int) -> list[PromptSpec]:
    count = args.num_prompts or max(MIN_PROMPTS, 2 * concurrency)
    seed = level_seed(args.seed, concurrency)
    if args.dataset_name == "sharegpt":
        counter = token_counter(tokenizer_folder(args))
        return sample_sharegpt(args.dataset_path, counter, count, seed, args.sharegpt_output_len)
    return build_prompts(count, args.input_len, args.output_len, seed)


def tokenizer_folder(args: argparse.Namespace) -> str:
    return str(args.tokenizer or baseline_folder(args))


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """Every option, JSON-friendly, plus the levels actually run."""
    values = {}
    for key, value in sorted(vars(args).items()):
        if key == "func":
            continue
        if isinstance(value, Path | LengthRange):
            value = str(value)
        values[key] = value
    values["concurrency_levels"] = concurrency_levels(args)
    values["api_key"] = "(set)" if args.api_key else None
    return values


def client_options(args: argparse.Namespace) -> ClientOptions:
    return ClientOptions(
        ignore_eos=args.ignore_eos,
        timeout_s=args.timeout,
        show_progress=not args.disable_tqdm,
        extra_body={**sampling_from_args(args).request_fields(), **args.extra_body},
    )


@dataclass
class Contender:
    """A server being measured: where to send requests and where its results go."""

    target: Target
    run: ServerRun
    limit: int | None = None  # at most this many prompts per level
    client: VllmSetup | None = None  # --vllm-client: vLLM's venv, to run its client too


async def warm_up(contender: Contender, options: ClientOptions) -> None:
    """One untimed request; a failure is noted (and the sweep still runs)."""
    quiet = replace(options, show_progress=False)
    records, _ = await run_level(contender.target, [WARMUP], 1, [0.0], quiet)
    if records[0].error:
        contender.run.notes.append(f"warm-up request failed: {records[0].error}")
        print(f"{contender.run.label}: warm-up request failed: {records[0].error}", flush=True)


async def measure_level(args: argparse.Namespace, contender: Contender, concurrency: int) -> None:
    """One concurrency level against one server, appended to its run (with the peaks the
    server reported meanwhile and, with --vllm-client, vLLM's client at the same load)."""
    prompts = prompts_for(args, concurrency)[: contender.limit]
    arrivals = arrival_times(len(prompts), args.request_rate, level_seed(args.seed, concurrency))
    label, target = contender.run.label, contender.target
    async with watching(target.base_url, target.api_key) as peaks:
        records, duration = await run_level(
            target, prompts, concurrency, arrivals, client_options(args), f"{label} c={concurrency}"
        )
    level = LevelResult(concurrency, len(prompts), level_metrics(records, duration), records)
    if peaks.samples:
        level.server = {"max_running": peaks.max_running}
        level.server["max_kv_cache_usage"] = peaks.max_kv_cache_usage
    if contender.client is not None:
        load = ClientLoad(concurrency, len(prompts), args.request_rate, args.seed)
        level.vllm_client = vllm_client_level(args, contender, load)
    contender.run.levels.append(level)
    print_level(label, level)


def vllm_client_level(args: argparse.Namespace, contender: Contender, load: ClientLoad) -> dict:
    """vLLM's client against the contender's server at ``load``."""
    client = contender.client
    assert client is not None and client.python is not None
    arguments = client_arguments(args, contender.target, tokenizer_folder(args), load)
    log = args.output_dir / f"vllm-client-{contender.run.label}.log"
    print(f"{contender.run.label} c={load.concurrency}: vLLM's client", flush=True)
    return run_vllm_client(client.python, arguments, client.env, log)


def print_level(label: str, level: LevelResult) -> None:
    m = level.metrics
    ttft = "-" if m.ttft.median_ms is None else f"{m.ttft.median_ms:.0f} ms"
    print(
        f"{label} concurrency {level.concurrency}: {m.completed} ok, {m.failed} failed in "
        f"{m.duration_s:.2f} s, {m.output_throughput:.1f} output tok/s, TTFT median {ttft}",
        flush=True,
    )


def open_contender(
    args: argparse.Namespace, base_url: str, model: str | None, label: str, limit: int | None
) -> Contender:
    """Resolve the model name, warm the server up, and start its (empty) run."""
    if model is None:
        model = asyncio.run(fetch_model_id(base_url, args.api_key))
    target = Target(base_url, model, args.endpoint, args.api_key)
    print(f"measuring {label} at {base_url} (model {model}, {args.endpoint})", flush=True)
    result = Contender(target, ServerRun(label, base_url, model), limit)
    asyncio.run(warm_up(result, client_options(args)))
    if limit:
        result.run.notes.append(
            f"sent only the first {limit} prompts of each level "
            "(a serial server's throughput does not depend on its queue length)"
        )
    return result


@contextlib.contextmanager
def target_url(args: argparse.Namespace) -> Iterator[str]:
    """The server under test: --base-url, or `octavo serve` launched for the block."""
    if not args.launch:
        yield args.base_url or DEFAULT_BASE_URL
        return
    port = free_port()
    extra = shlex.split(args.serve_args)
    if args.max_model_len is not None:
        extra += ["--max-model-len", str(args.max_model_len)]
    command = octavo_serve_command(port, args.model_path, args.dtype, extra)
    log = args.output_dir / f"serve-{args.label}.log"
    with child_server(args.label, command, port, log, args.startup_timeout) as server:
        yield server.base_url


def baseline_folder(args: argparse.Namespace) -> str | Path:
    """--baseline-model, else --model-path, else the embedded SmolLM2 folder."""
    folder = args.baseline_model or args.model_path
    if folder is None:
        from octavo.model_executor.embedded import embedded_model_folder

        folder = embedded_model_folder()
    return folder


@contextlib.contextmanager
def hf_url(args: argparse.Namespace) -> Iterator[str]:
    """The naive HF server on a free loopback port, for the block."""
    port = free_port()
    folder, dtype, device = baseline_folder(args), args.baseline_dtype, args.baseline_device
    command = hf_server_command(port, folder, dtype, device)
    log = args.output_dir / f"serve-{HF}.log"
    with child_server(HF, command, port, log, args.startup_timeout) as server:
        yield server.base_url


def reported_max_model_len(args: argparse.Namespace, target: Target) -> int | None:
    """The target's max_model_len as its /v1/models card says (Octavo's does), else None."""
    cards = asyncio.run(fetch_models(target.base_url, args.api_key))
    card = next((card for card in cards if card.get("id") == target.model), cards[0])
    value = card.get("max_model_len")
    return value if isinstance(value, int) else None


@contextlib.contextmanager
def vllm_server(
    args: argparse.Namespace, vllm: VllmSetup, served_name: str, max_model_len: int | None
) -> Iterator[ChildServer]:
    """vLLM's OpenAI server from its venv on a free loopback port, for the block."""
    port = free_port()
    folder = baseline_folder(args)
    command = vllm_server_command(
        str(vllm.python), port, folder, served_name, vllm.dtype, max_model_len
    )
    log = args.output_dir / f"serve-{VLLM}.log"
    with child_server(VLLM, command, port, log, args.vllm_startup_timeout, vllm.env) as server:
        yield server


def open_vllm(
    args: argparse.Namespace,
    stack: contextlib.ExitStack,
    vllm: VllmSetup,
    target: TargetFacts,
    report: ServeReport,
) -> Contender | None:
    """vLLM serving the target's model name and max_model_len; None (noted) without vLLM."""
    report.settings[VLLM] = vllm.describe()
    if vllm.python is None:
        message = f"vllm baseline skipped: {vllm.skip_reason}"
        print(message, file=sys.stderr)
        report.notes.append(message)
        return None
    name, max_model_len = target.model, target.max_model_len
    server = stack.enter_context(vllm_server(args, vllm, name, max_model_len))
    vllm.facts.update(max_model_len=max_model_len, startup_s=round(server.startup_s, 1))
    report.settings[VLLM] = vllm.describe()
    contender = open_contender(args, server.base_url, name, VLLM, None)
    contender.run.notes.append(f"cold start to healthy: {server.startup_s:.0f} s")
    return contender


def run(args: argparse.Namespace) -> int:
    """The benchmark; a launched server that fails to start ends it with exit code 1."""
    logging.getLogger("httpx").setLevel(logging.WARNING)  # no line per request
    vllm = VllmSetup.from_args(args) if VLLM in args.baseline or args.vllm_client else None
    if vllm is not None and vllm.python is None and (args.vllm_python or args.vllm_client):
        raise ValueError(vllm.skip_reason)  # a wrong path: say so before starting anything
    if args.dataset_name == "sharegpt" and args.dataset_path is None:
        raise ValueError("--dataset-name sharegpt needs --dataset-path")
    args.output_dir.mkdir(parents=True, exist_ok=True)
    try:
        report = run_sweeps(args, vllm)
    except LaunchError as error:
        print(f"{PROG} serve: {error}", file=sys.stderr)
        return 1
    save(report, args.output_dir, "serve")
    return 0


@dataclass
class TargetFacts:
    """What the baselines copy from the server under test."""

    model: str
    max_model_len: int | None


def run_sweeps(args: argparse.Namespace, vllm: VllmSetup | None = None) -> ServeReport:
    """Every level against the server under test and each baseline.

    By default one server is up at a time (all its levels, then it stops): on a small
    machine a second resident server (vLLM's holds ~6 GB) skews the first's figures.
    ``--no-one-at-a-time`` keeps them all up and alternates per level instead, which
    spreads slow drifts in machine load over all servers alike.
    """
    report = ServeReport(settings(args), target=args.label)
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(target_url(args))
        target = open_contender(args, url, args.model, args.label, None)
        target.client = vllm if args.vllm_client else None
        facts = TargetFacts(
            target.target.model,
            args.max_model_len or reported_max_model_len(args, target.target),
        )
        contenders = [target]
        if args.one_at_a_time:
            sweep(args, target)
            stack.close()
        for name in args.baseline:
            each = open_baseline(args, stack, name, vllm, facts, report)
            if each is not None and args.vllm_client:
                each.client = vllm
            if each is not None and args.one_at_a_time:
                sweep(args, each)
                stack.close()
            contenders += filter(None, [each])
        if not args.one_at_a_time:
            for concurrency in concurrency_levels(args):
                for each in contenders:
                    asyncio.run(measure_level(args, each, concurrency))
    report.runs = [each.run for each in contenders]
    return report


def sweep(args: argparse.Namespace, contender: Contender) -> None:
    for concurrency in concurrency_levels(args):
        asyncio.run(measure_level(args, contender, concurrency))


def open_baseline(
    args: argparse.Namespace,
    stack: contextlib.ExitStack,
    name: str,
    vllm: VllmSetup | None,
    facts: TargetFacts,
    report: ServeReport,
) -> Contender | None:
    if name == HF:
        url = stack.enter_context(hf_url(args))
        return open_contender(args, url, None, HF, args.baseline_num_prompts)
    if name == VLLM and vllm is not None:
        return open_vllm(args, stack, vllm, facts, report)
    return None
