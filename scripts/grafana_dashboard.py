#!/usr/bin/env python3
"""Generate the Grafana dashboard of Octavo's server from its vLLM-named metrics.

Writes charts/octavo/dashboards/octavo-server.json (the chart ships it in a ConfigMap for
Grafana's dashboard sidecar). The dashboard picks its Prometheus data source, namespace
and model through template variables, so one copy serves every InferenceService.

    python scripts/grafana_dashboard.py            # (re)write the file
    python scripts/grafana_dashboard.py --check    # exit 1 if the file is out of date

Plain json and no Octavo import: tests/test_dashboard.py checks every expression
against the metrics a running server exports.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

OUTPUT = Path(__file__).resolve().parents[1] / "charts/octavo/dashboards/octavo-server.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SELECTOR = 'namespace=~"$namespace", model_name=~"$model_name"'
RATE = "[$__rate_interval]"
QUANTILES = (0.5, 0.9, 0.99)
PANEL_WIDTH, PANEL_HEIGHT, COLUMNS = 12, 8, 2


def rate(metric: str) -> str:
    return f"rate({metric}{{{SELECTOR}}}{RATE})"


def target(expr: str, legend: str, ref: int) -> dict[str, Any]:
    return {
        "datasource": DATASOURCE,
        "expr": expr,
        "legendFormat": legend,
        "range": True,
        "refId": chr(ord("A") + ref),
    }


def quantile_targets(histogram: str) -> list[dict[str, Any]]:
    """p50/p90/p99 over all pods of the selection, from the histogram's buckets."""
    buckets = "sum by (le) (" + rate(f"{histogram}_bucket") + ")"
    return [
        target(f"histogram_quantile({q}, {buckets})", f"p{round(q * 100)}", ref)
        for ref, q in enumerate(QUANTILES)
    ]


def mean_target(histogram: str, legend: str, ref: int) -> dict[str, Any]:
    expr = f"sum({rate(f'{histogram}_sum')}) / sum({rate(f'{histogram}_count')})"
    return target(expr, legend, ref)


def panel_specs() -> list[tuple[str, str, str, list[dict[str, Any]]]]:
    """(title, unit, description, targets) of every panel, in reading order."""
    return [
        (
            "Request throughput",
            "reqps",
            "Finished requests per second, by finish reason.",
            [
                target(
                    f"sum by (finished_reason) ({rate('vllm:request_success_total')})",
                    "{{finished_reason}}",
                    0,
                )
            ],
        ),
        (
            "Token throughput",
            "suffix: tok/s",
            "Prompt and generated tokens per second.",
            [
                target(f"sum({rate('vllm:prompt_tokens_total')})", "prompt", 0),
                target(f"sum({rate('vllm:generation_tokens_total')})", "generation", 1),
            ],
        ),
        (
            "Time to first token (TTFT)",
            "s",
            "Arrival to first output token, percentiles.",
            quantile_targets("vllm:time_to_first_token_seconds"),
        ),
        (
            "Inter-token latency (ITL)",
            "s",
            "Time between output tokens, percentiles.",
            quantile_targets("vllm:inter_token_latency_seconds"),
        ),
        (
            "End-to-end request latency",
            "s",
            "Arrival to finish, percentiles.",
            quantile_targets("vllm:e2e_request_latency_seconds"),
        ),
        (
            "Queue time",
            "s",
            "Arrival to first scheduled step, percentiles.",
            quantile_targets("vllm:request_queue_time_seconds"),
        ),
        (
            "Running and waiting requests",
            "short",
            "Requests in the engine, summed over pods.",
            [
                target(f"sum(vllm:num_requests_running{{{SELECTOR}}})", "running", 0),
                target(f"sum(vllm:num_requests_waiting{{{SELECTOR}}})", "waiting", 1),
            ],
        ),
        (
            "KV cache usage",
            "percentunit",
            "Share of KV cache blocks in use, per pod.",
            [target(f"vllm:kv_cache_usage_perc{{{SELECTOR}}}", "{{pod}} {{instance}}", 0)],
        ),
        (
            "Prefix cache hit rate",
            "percentunit",
            "Prompt tokens found in the prefix cache.",
            [
                target(
                    f"sum({rate('vllm:prefix_cache_hits_total')}) / "
                    f"sum({rate('vllm:prefix_cache_queries_total')})",
                    "hit rate",
                    0,
                )
            ],
        ),
        (
            "Preemptions",
            "short",
            "Sequences preempted (recomputed later) per second.",
            [target(f"sum({rate('vllm:num_preemptions_total')})", "preemptions/s", 0)],
        ),
        (
            "Tokens per request (mean)",
            "short",
            "Mean prompt and generation length.",
            [
                mean_target("vllm:request_prompt_tokens", "prompt", 0),
                mean_target("vllm:request_generation_tokens", "generation", 1),
            ],
        ),
    ]


def panel(index: int, title: str, unit: str, description: str, targets: list) -> dict[str, Any]:
    grid = {
        "h": PANEL_HEIGHT,
        "w": PANEL_WIDTH,
        "x": (index % COLUMNS) * PANEL_WIDTH,
        "y": (index // COLUMNS) * PANEL_HEIGHT,
    }
    defaults: dict[str, Any] = {"unit": unit, "min": 0}
    if unit == "percentunit":
        defaults["max"] = 1
    return {
        "id": index + 1,
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "gridPos": grid,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "none"},
        },
        "targets": targets,
    }


def query_variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": f"{name}-variable"},
        "refresh": 2,
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
        "hide": 0,
    }


def templating() -> dict[str, Any]:
    datasource = {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "refresh": 1,
        "hide": 0,
    }
    namespace = query_variable(
        "namespace", "Namespace", "label_values(vllm:num_requests_running, namespace)"
    )
    model = query_variable(
        "model_name",
        "Model",
        'label_values(vllm:num_requests_running{namespace=~"$namespace"}, model_name)',
    )
    return {"list": [datasource, namespace, model]}


def dashboard() -> dict[str, Any]:
    panels = [panel(i, *spec) for i, spec in enumerate(panel_specs())]
    return {
        "uid": "octavo-server",
        "title": "Octavo server",
        "description": "Octavo's OpenAI-compatible servers: traffic, latency, KV cache.",
        "tags": ["octavo", "vllm", "llm"],
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "browser",
        "templating": templating(),
        "annotations": {"list": []},
        "links": [],
        "panels": panels,
        "version": 1,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--output", type=Path, default=OUTPUT, help=f"default: {OUTPUT}")
    parser.add_argument("--check", action="store_true", help="exit 1 if the file differs")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is out of date: run {sys.argv[0]}", file=sys.stderr)
            return 1
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
