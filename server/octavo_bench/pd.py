"""`python -m octavo_bench pd`: prefill/decode disaggregation against co-location, at
equal total processes, on a mixed workload of long prompts and short chats.

Setups (each on fresh servers of the same settings, the same seeded requests):

- ``co-located``: two ``octavo serve`` processes; each request goes whole to the one with
  fewer in flight, so long prefills share steps with the short chats' decodes.
- ``pd``: a prefill and a decode server, both ``--kv-transfer-config`` NixlConnector with
  their side channel on loopback; the benchmark plays the llm-d routing sidecar (a
  ``max_tokens: 1`` prefill with ``do_remote_decode``, then the streamed request with the
  returned ``kv_transfer_params`` to the decode server) for every request, as llm-d's
  always-disagg decider does.
- ``pd-threshold``: the same, but prompts under ``--threshold-words`` go straight to the
  decode server (llm-d's prefix-based decider).

Reported: ITL p50/p99 and TTFT p50/p99 of the short chats, TTFT of the long requests, the
co-located / P/D ratios, each server's CPU seconds, and the KV transfer cost per block from
the decode server's ``/metrics`` (``vllm:kv_transfer_seconds``, ``_received_bytes``), then a
paragraph modelling the multi-machine case from it. With ``--pin`` (the default) each
server runs on a core of its own (``taskset``, ``--num-threads 1``): on a machine of few
cores every process still shares the memory bandwidth and this benchmark's client.
Writes pd.json and pd.png.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import re
import shlex
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import psutil

from octavo.model_executor.model_folders import resolve_model_folder
from octavo_bench.engine_options import default_dtype
from octavo_bench.parsers import add_output_dir, name_list, register_subcommand
from octavo_bench.pd_proxy import LeastLoaded, PrefillThenDecode, Route, run_mixed
from octavo_bench.pd_report import COLOCATED, PdReport, SetupResult, Transfers
from octavo_bench.pd_workload import (
    LONG,
    SHORT,
    MixedRequest,
    StreamSpec,
    mixed_requests,
    stream_requests,
)
from octavo_bench.report import machine_info, save
from octavo_bench.serve_client import ClientOptions, Target
from octavo_bench.serve_launch import ChildServer, child_server, free_port, octavo_serve_command
from octavo_bench.serve_server_stats import metric_values
from octavo_bench.serve_workload import PromptSpec

PD, PD_THRESHOLD = "pd", "pd-threshold"
SETUPS = (COLOCATED, PD, PD_THRESHOLD)
BLOCK_SIZE = 16
TRANSFER_CONFIG = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="model folder (default: embedded SmolLM2)")
    parser.add_argument("--dtype", default=default_dtype(), help="as octavo serve --dtype")
    parser.add_argument("--served-model-name", default="octavo-bench")
    parser.add_argument("--setups", type=name_list(SETUPS), default=list(SETUPS))
    parser.add_argument("--long-count", type=int, default=8)
    parser.add_argument("--long-words", type=int, default=1500, help="about a token each")
    parser.add_argument("--long-tokens", type=int, default=4, help="output tokens")
    parser.add_argument("--long-rate", type=float, default=0.133, help="requests a second")
    parser.add_argument("--short-count", type=int, default=72)
    parser.add_argument("--short-words", type=int, default=32)
    parser.add_argument("--short-tokens", type=int, default=64, help="streamed output tokens")
    parser.add_argument("--short-rate", type=float, default=1.2, help="requests a second")
    parser.add_argument(
        "--threshold-words",
        type=int,
        default=256,
        help="pd-threshold: prompts shorter than this skip the prefill server",
    )
    parser.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="each server on a core of its own (taskset) with --num-threads 1",
    )
    parser.add_argument(
        "--serve-flags",
        default="--max-model-len 2048",
        help="extra `octavo serve` flags for every server (default: %(default)s)",
    )
    parser.add_argument(
        "--idle-pulls",
        type=int,
        default=3,
        help="after each P/D run, this many fresh long prompts split one at a time: the "
        "transfer cost per block on idle servers (default: %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    add_output_dir(parser, "pd")


def register(kinds: argparse._SubParsersAction) -> None:
    register_subcommand(
        kinds, "pd", "prefill/decode disaggregation vs co-location", __doc__, "", add_arguments, run
    )


def check(args: argparse.Namespace) -> None:
    for name in ("long_count", "long_words", "long_tokens", "short_count", "short_words"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if args.short_tokens < 2:
        raise ValueError("--short-tokens must be at least 2 (ITL needs two tokens)")
    if not (args.long_rate > 0 and args.short_rate > 0):
        raise ValueError("--long-rate and --short-rate must be above 0")


def run(args: argparse.Namespace) -> int:
    check(args)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    long = StreamSpec(LONG, args.long_count, args.long_words, args.long_tokens, args.long_rate)
    short = StreamSpec(
        SHORT, args.short_count, args.short_words, args.short_tokens, args.short_rate
    )
    requests = mixed_requests(long, short, args.seed)
    block_bytes = kv_block_bytes(args.model, args.dtype)
    report = PdReport(machine_info(dtype=args.dtype), run_config(args, block_bytes))
    for name in args.setups:
        report.setups.append(run_setup(name, args, requests, block_bytes))
    report.notes += notes(args)
    save(report, args.output_dir, "pd")
    return 0


def kv_block_bytes(model: str | None, dtype: str) -> int:
    import torch

    from octavo.kv_cache.cache_tensors import bytes_per_block
    from octavo.model_executor.model_config import ModelConfig

    config = ModelConfig.from_folder(resolve_model_folder(model))
    return bytes_per_block(config, BLOCK_SIZE, getattr(torch, dtype))


def run_config(args: argparse.Namespace, block_bytes: int) -> dict:
    shown = {k: v for k, v in vars(args).items() if k not in ("func", "output_dir")}
    return {
        **shown,
        "model": args.model or "embedded SmolLM2-135M-Instruct",
        "long_prompt_words": args.long_words,
        "block_size": BLOCK_SIZE,
        "block_bytes": block_bytes,
        "cpus": len(os.sched_getaffinity(0)),
    }


def notes(args: argparse.Namespace) -> list[str]:
    cpus = sorted(os.sched_getaffinity(0))
    pinned = (
        f"each server pinned to one core (taskset -c {cpus[0]} / {cpus[1 % len(cpus)]}, "
        "--num-threads 1)"
        if args.pin
        else "servers not pinned: they share every core"
    )
    return [
        f"all processes (both servers, this client) run on one machine of {len(cpus)} CPUs; "
        f"{pinned}; the benchmark's client shares those cores too",
        "prompts are random words (about one token each); TTFT of a split request counts "
        "from the prefill request's start; co-located servers run without a KV connector",
    ]


def run_setup(
    name: str, args: argparse.Namespace, requests: Sequence[MixedRequest], block_bytes: int
) -> SetupResult:
    split = name != COLOCATED
    log_dir = args.output_dir / "pd-logs" / name
    with servers(args, split, log_dir) as (first, second):
        options = ClientOptions(show_progress=False)
        targets = [Target(s.base_url, args.served_model_name) for s in (first, second)]
        route: Route
        if split:
            threshold = args.threshold_words if name == PD_THRESHOLD else 0
            route = PrefillThenDecode(targets[0], targets[1], options, threshold)
        else:
            route = LeastLoaded(targets, options)
        warm_up(route, args)
        before_cpu, before = cpu_seconds((first, second)), scrape(second)
        print(f"{name}: {len(requests)} requests", flush=True)
        sent, duration = asyncio.run(run_mixed(requests, route, options))
        cpu = [b - a for a, b in zip(before_cpu, cpu_seconds((first, second)), strict=True)]
        result = SetupResult(name, ["whole requests"] * 2, sent, duration, cpu)
        if split:
            result.servers = ["prefill", "decode"]
            result.transfers = transfers_between(before, scrape(second), block_bytes)
            result.idle_transfers = idle_transfers(route, args, second, block_bytes)
    return result


def idle_transfers(
    route: Route, args: argparse.Namespace, decode: ChildServer, block_bytes: int
) -> Transfers | None:
    """Fresh long prompts split one at a time on the idle servers: the pulls' own cost,
    without waiting for a busy prefill engine's step (reads run between its steps)."""
    if args.idle_pulls < 1:
        return None
    spec = StreamSpec(LONG, args.idle_pulls, args.long_words, args.long_tokens, 1.0)
    before = scrape(decode)
    for request in stream_requests(spec, args.seed * 2 + 13):
        alone = dataclasses.replace(request, at_s=0.0)
        asyncio.run(run_mixed([alone], route, ClientOptions(show_progress=False)))
    return transfers_between(before, scrape(decode), block_bytes)


@contextlib.contextmanager
def servers(
    args: argparse.Namespace, split: bool, log_dir: Path
) -> Iterator[tuple[ChildServer, ChildServer]]:
    cpus = sorted(os.sched_getaffinity(0))
    with contextlib.ExitStack() as stack:
        started = []
        for index, role in enumerate(("prefill", "decode") if split else ("a", "b")):
            port, env, command = free_port(), dict(os.environ), []
            extra = ["--served-model-name", args.served_model_name, "--block-size", "16"]
            extra += shlex.split(args.serve_flags)
            if args.pin:
                command = ["taskset", "-c", str(cpus[index % len(cpus)])]
                extra += ["--num-threads", "1"]
                env["OMP_NUM_THREADS"] = "1"
            if split:
                extra += ["--kv-transfer-config", json.dumps(TRANSFER_CONFIG)]
                env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = "127.0.0.1"
                env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(free_port())
            command += octavo_serve_command(port, args.model, args.dtype, extra)
            log = log_dir / f"{role}.log"
            server = child_server(role, command, port, log, args.startup_timeout, env=env)
            started.append(stack.enter_context(server))
        yield started[0], started[1]


def warm_up(route: Route, args: argparse.Namespace) -> None:
    """Two short requests (each server, or one split request's both halves) untimed."""
    prompt = PromptSpec(" ".join(["warm"] * args.short_words), args.short_words, 4)
    warm = [MixedRequest(SHORT, prompt, 0.0), MixedRequest(SHORT, prompt, 0.0)]
    sent, _ = asyncio.run(run_mixed(warm, route, ClientOptions(show_progress=False)))
    errors = [s.record.error for s in sent if not s.record.success]
    if errors:
        raise RuntimeError(f"the warm-up request failed: {errors[0]}")


def cpu_seconds(started: Sequence[ChildServer]) -> list[float]:
    """User + sys seconds of each server's process tree so far."""
    totals = []
    for server in started:
        root = psutil.Process(server.process.pid)
        total = 0.0
        for process in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                times = process.cpu_times()
                total += times.user + times.system
        totals.append(total)
    return totals


def scrape(server: ChildServer) -> str:
    return httpx.get(server.base_url + "/metrics", timeout=10, trust_env=False).text


def labeled(text: str, name: str, label: str) -> dict[str, float]:
    """``name``'s values by the value of its label ``label`` (summed over the others)."""
    found: dict[str, float] = {}
    pattern = re.compile(rf'^{re.escape(name)}\{{[^}}]*{label}="([^"]*)"[^}}]*\}} (\S+)$', re.M)
    for value_label, value in pattern.findall(text):
        found[value_label] = found.get(value_label, 0.0) + float(value)
    return found


def transfers_between(before: str, after: str, block_bytes: int) -> Transfers:
    plain = [metric_values(before), metric_values(after)]
    outcomes = [labeled(t, "vllm:kv_transfer_requests_total", "outcome") for t in (before, after)]
    sources = [labeled(t, "vllm:prompt_tokens_by_source_total", "source") for t in (before, after)]

    def grown(pair: list[dict[str, float]], key: str) -> float:
        return pair[1].get(key, 0.0) - pair[0].get(key, 0.0)

    return Transfers(
        seconds=grown(plain, "vllm:kv_transfer_seconds_total"),
        bytes=grown(plain, "vllm:kv_transfer_received_bytes_total"),
        ok=grown(outcomes, "ok"),
        failed=grown(outcomes, "failed"),
        tokens_received=grown(sources, "external_kv_transfer"),
        tokens_computed=grown(sources, "local_compute"),
        block_bytes=block_bytes,
    )
