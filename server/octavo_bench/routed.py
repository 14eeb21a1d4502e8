"""`python -m octavo_bench routed`: replicas behind the endpoint picker vs round-robin.

Several tenants each have a long system prompt shared by many users (see routed_workload),
more prompts than one replica's KV cache holds (--kv-cache-memory per replica), as in
production, where the cache is what runs out. The same requests run three times, each time
on fresh replicas (empty caches):

1. **single replica**: one replica with the pool's whole KV cache (REPLICAS x
   --kv-cache-memory), called directly: the hit rate of one shared cache, which a router
   should keep when it spreads the load (the reference);
2. **round-robin**: N replicas behind a gateway that takes them in turn, as a plain
   Kubernetes Service spreads connections;
3. **endpoint picker**: the same N replicas and the same gateway, which asks the llm-d
   router's EPP (precise prefix-cache scorer fed by the replicas' KV events, queue and
   KV-cache-use scorers) where each request goes (Envoy's ext_proc protocol).

Per run: prefix-cache hit rate (hit tokens / looked-up tokens, summed over the replicas'
`vllm:prefix_cache_*` counters), TTFT p50/p99, output tok/s, requests per replica. The
issue's targets: the picker's hit rate >= 0.9 x the single replica's, and TTFT p50 at
least 2x better than round-robin. JSON + PNG go to --output-dir.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import shlex
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from octavo.arg_types import parse_size
from octavo_bench.parsers import add_output_dir, register_subcommand
from octavo_bench.report import machine_info, ratio, save, table
from octavo_bench.routed_stack import (
    StackOptions,
    counters,
    endpoint_picker,
    endpoints_file,
    gateway,
    picker_config,
    replicas,
)
from octavo_bench.routed_workload import TenantWorkload, tenant_prompts
from octavo_bench.serve_client import ClientOptions, Target, run_level
from octavo_bench.serve_launch import ChildServer
from octavo_bench.serve_metrics import level_metrics

SINGLE, ROUND_ROBIN, PICKER = "single replica", "round-robin", "endpoint picker"


@dataclass
class RoutedRun:
    name: str
    replicas: int
    hit_rate: float
    requests_per_replica: list[int]
    output_tok_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    failed: int


@dataclass
class RoutedReport:
    settings: dict[str, Any]
    runs: list[RoutedRun] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=machine_info)

    def run(self, name: str) -> RoutedRun | None:
        return next((run for run in self.runs if run.name == name), None)

    def targets(self) -> dict[str, Any]:
        single, robin, picked = self.run(SINGLE), self.run(ROUND_ROBIN), self.run(PICKER)
        if not (single and robin and picked):
            return {}
        hit_ratio = ratio(picked.hit_rate, single.hit_rate)
        ttft_gain = ratio(robin.ttft_p50_ms, picked.ttft_p50_ms)
        return {
            "hit_rate_vs_single": hit_ratio,
            "hit_rate_target_met": hit_ratio is not None and hit_ratio >= 0.9,
            "ttft_p50_gain_vs_round_robin": ttft_gain,
            "ttft_target_met": ttft_gain is not None and ttft_gain >= 2.0,
        }

    def to_json(self) -> dict[str, Any]:
        runs = [asdict(run) for run in self.runs]
        return {
            "benchmark": "routed",
            "settings": self.settings,
            "runs": runs,
            "targets": self.targets(),
            "machine": self.machine,
            "notes": self.notes,
        }

    def text(self) -> str:
        headers = [
            "run",
            "replicas",
            "hit rate",
            "TTFT p50 ms",
            "TTFT p99 ms",
            "tok/s",
            "requests per replica",
            "failed",
        ]
        rows = [
            [
                r.name,
                str(r.replicas),
                f"{r.hit_rate:.3f}",
                f"{r.ttft_p50_ms:.0f}",
                f"{r.ttft_p99_ms:.0f}",
                f"{r.output_tok_s:.1f}",
                "/".join(map(str, r.requests_per_replica)),
                str(r.failed),
            ]
            for r in self.runs
        ]
        lines = [table(headers, rows)]
        for key, value in self.targets().items():
            lines.append(f"{key}: {value:.2f}" if isinstance(value, float) else f"{key}: {value}")
        return "\n".join(lines + self.notes)

    def draw(self, plt: Any) -> Any:
        figure, (hits, ttft) = plt.subplots(1, 2, figsize=(10, 4))
        names = [run.name for run in self.runs]
        hits.bar(names, [run.hit_rate for run in self.runs], color="tab:green")
        hits.set_title("prefix-cache hit rate")
        hits.set_ylim(0, 1)
        positions = range(len(names))
        ttft.bar([p - 0.2 for p in positions], [r.ttft_p50_ms for r in self.runs], 0.4, label="p50")
        ttft.bar([p + 0.2 for p in positions], [r.ttft_p99_ms for r in self.runs], 0.4, label="p99")
        ttft.set_xticks(list(positions), names)
        ttft.set_title("time to first token (ms)")
        ttft.legend()
        return figure


def run_record(name: str, servers: Sequence[ChildServer], records, duration, before, after):
    hits, queries, done = (
        [a - b for a, b in zip(after[key], before[key], strict=True)] for key in COUNTER_KEYS
    )
    metrics = level_metrics(records, duration)
    return RoutedRun(
        name=name,
        replicas=len(servers),
        hit_rate=sum(hits) / sum(queries) if sum(queries) else 0.0,
        requests_per_replica=[round(count) for count in done],
        output_tok_s=metrics.output_throughput,
        ttft_p50_ms=metrics.ttft.median_ms or 0.0,
        ttft_p99_ms=metrics.ttft.p99_ms or 0.0,
        failed=metrics.failed,
    )


COUNTER_KEYS = (
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_queries_total",
    "vllm:request_success_total",
)


def measure(name: str, base_url: str, servers, args: argparse.Namespace) -> RoutedRun:
    prompts = [prompt for _, prompt in tenant_prompts(workload_of(args))]
    target = Target(base_url, args.served_model_name, "completions")
    before = counters(servers, COUNTER_KEYS)
    records, duration = asyncio.run(
        run_level(
            target, prompts, args.concurrency, [0.0] * len(prompts), ClientOptions(), label=name
        )
    )
    return run_record(name, servers, records, duration, before, counters(servers, COUNTER_KEYS))


def workload_of(args: argparse.Namespace) -> TenantWorkload:
    return TenantWorkload(
        args.tenants,
        args.users_per_tenant,
        args.system_words,
        max_tokens=args.max_tokens,
        seed=args.seed,
    )


def stack_options(
    args: argparse.Namespace, replicas_count: int, log_dir: Path, cache_bytes: int
) -> StackOptions:
    flags = [*shlex.split(args.serve_flags), "--kv-cache-memory", str(cache_bytes)]
    return StackOptions(args.model, args.served_model_name, replicas_count, log_dir, tuple(flags))


def epp_binary(explicit: Path | None) -> Path:
    """--epp-binary, else the endpoint picker the e2e suite builds (cached after one build)."""
    if explicit is not None:
        return explicit
    from e2e.cluster import build  # the repository's e2e package: run from the repo root

    return build.ensure_built(("epp",))["epp"]


def run_single(args: argparse.Namespace, log_dir: Path) -> RoutedRun:
    # One replica with the pool's whole KV cache: the hit rate of one shared cache.
    options = stack_options(args, 1, log_dir / "single", args.kv_cache_memory * args.replicas)
    with replicas(options, kv_events=False) as servers:
        return measure(SINGLE, servers[0].base_url, servers, args)


def run_round_robin(args: argparse.Namespace, log_dir: Path) -> RoutedRun:
    folder = log_dir / "round-robin"
    with contextlib.ExitStack() as stack:
        options = stack_options(args, args.replicas, folder, args.kv_cache_memory)
        servers = stack.enter_context(replicas(options, kv_events=False))
        front = stack.enter_context(gateway(folder, None, servers))
        return measure(ROUND_ROBIN, front.base_url, servers, args)


def run_picker(args: argparse.Namespace, log_dir: Path, binary: Path) -> RoutedRun:
    folder = log_dir / "picker"
    with contextlib.ExitStack() as stack:
        options = stack_options(args, args.replicas, folder, args.kv_cache_memory)
        servers = stack.enter_context(replicas(options, kv_events=True))
        found = endpoints_file(folder / "endpoints.yaml", servers)
        config = picker_config(found, args.served_model_name, servers[0].base_url)
        picker = stack.enter_context(endpoint_picker(binary, config, folder))
        front = stack.enter_context(gateway(folder, picker, servers))
        return measure(PICKER, front.base_url, servers, args)


def run(args: argparse.Namespace) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # no line per request
    if min(args.replicas, args.tenants, args.users_per_tenant, args.concurrency) < 1:
        raise ValueError("--replicas, --tenants, --users-per-tenant, --concurrency must be >= 1")
    binary = epp_binary(args.epp_binary)
    log_dir = args.output_dir / "routed-logs"
    report = RoutedReport(settings={k: str(v) for k, v in vars(args).items() if k != "func"})
    report.runs.append(run_single(args, log_dir))
    report.runs.append(run_round_robin(args, log_dir))
    report.runs.append(run_picker(args, log_dir, binary))
    save(report, args.output_dir, "routed")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="model folder or id (default: the embedded model)")
    parser.add_argument("--served-model-name", default="octavo-bench")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--tenants", type=int, default=8, help="system prompts")
    parser.add_argument("--users-per-tenant", type=int, default=12)
    parser.add_argument("--system-words", type=int, default=700, help="about 1.3 tokens each")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--kv-cache-memory",
        type=parse_size,
        default=parse_size("160MiB"),
        help="KV cache of each replica; the single-replica run gets REPLICAS times this "
        "(default 160MiB: SmolLM2 in fp32, 46 KB a token, holds 3-4 default system prompts)",
    )
    parser.add_argument(
        "--serve-flags",
        default="--num-threads 1 --max-model-len 2048",
        help="extra `octavo serve` flags for every replica (default: %(default)s)",
    )
    parser.add_argument(
        "--epp-binary",
        type=Path,
        help="the llm-d router's epp (default: the one e2e builds, cached)",
    )
    add_output_dir(parser, "routed")


def register(kinds: argparse._SubParsersAction) -> None:
    register_subcommand(
        kinds,
        "routed",
        "replicas behind the endpoint picker vs round-robin",
        __doc__,
        "",
        add_arguments,
        run,
    )
