"""Results of ``octavo bench serve``: the tables it prints, its JSON and its PNG."""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from octavo.benchmarks.serve_metrics import LevelMetrics, RequestRecord, Summary

TARGET = "octavo"
BASELINE = "hf"


@dataclass
class LevelResult:
    """One concurrency level against one server: its figures and every request."""

    concurrency: int
    num_prompts: int
    metrics: LevelMetrics
    records: list[RequestRecord]

    def to_json(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "num_prompts": self.num_prompts,
            **asdict(self.metrics),
            "errors": sorted({r.error for r in self.records if r.error}),
            "requests": [record.to_json() for record in self.records],
        }


@dataclass
class ServerRun:
    """A full concurrency sweep against one server."""

    label: str
    base_url: str
    model: str
    levels: list[LevelResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def level(self, concurrency: int) -> LevelResult | None:
        return next((lv for lv in self.levels if lv.concurrency == concurrency), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "base_url": self.base_url,
            "model": self.model,
            "notes": self.notes,
            "levels": [level.to_json() for level in self.levels],
        }


@dataclass
class ServeReport:
    settings: dict[str, Any]
    runs: list[ServerRun] = field(default_factory=list)
    target: str = TARGET  # the label of the server under test

    def run(self, label: str) -> ServerRun | None:
        return next((run for run in self.runs if run.label == label), None)


def improvement_ratios(target: ServerRun, baseline: ServerRun) -> dict[int, float]:
    """Per concurrency level: target output tok/s over baseline output tok/s."""
    ratios = {}
    for level in target.levels:
        other = baseline.level(level.concurrency)
        if other is not None and other.metrics.output_throughput > 0:
            ratios[level.concurrency] = (
                level.metrics.output_throughput / other.metrics.output_throughput
            )
    return ratios


def report_ratios(report: ServeReport) -> dict[int, float]:
    target, baseline = report.run(report.target), report.run(BASELINE)
    if target is None or baseline is None:
        return {}
    return improvement_ratios(target, baseline)


def machine_info() -> dict[str, Any]:
    """About the machine the client ran on (the servers' when launched here)."""
    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def json_safe(value: Any) -> Any:
    """Infinite floats (``--request-rate inf``) become the string ``"inf"``."""
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    if isinstance(value, dict):
        return {str(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value


def write_json(report: ServeReport, path: Path) -> None:
    payload = {
        "settings": report.settings,
        "machine": machine_info(),
        "servers": {run.label: run.to_json() for run in report.runs},
        "improvement_ratios": {
            "definition": f"{report.target} output tok/s / {BASELINE} output tok/s, per level",
            "by_concurrency": report_ratios(report),
        },
    }
    path.write_text(json.dumps(json_safe(payload), indent=2, allow_nan=False) + "\n")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _triple(summary: Summary) -> str:
    return "/".join(_ms(v) for v in (summary.mean_ms, summary.median_ms, summary.p99_ms))


def format_run(run: ServerRun) -> str:
    """Throughput and latency tables of one server's sweep."""
    lines = [
        f"== {run.label}: {run.base_url} (model {run.model}) ==",
        f"{'conc':>4} {'ok':>4} {'fail':>4} {'dur s':>7} {'req/s':>7} "
        f"{'out tok/s':>10} {'tot tok/s':>10}   latency ms mean/median/p99: "
        "TTFT | TPOT | ITL | E2EL",
    ]
    for level in run.levels:
        m = level.metrics
        lines.append(
            f"{level.concurrency:>4} {m.completed:>4} {m.failed:>4} {m.duration_s:>7.2f} "
            f"{m.request_throughput:>7.2f} {m.output_throughput:>10.1f} "
            f"{m.total_token_throughput:>10.1f}   {_triple(m.ttft)} | {_triple(m.tpot)} | "
            f"{_triple(m.itl)} | {_triple(m.e2el)}"
        )
    for level in run.levels:
        for error in sorted({r.error for r in level.records if r.error}):
            lines.append(f"  concurrency {level.concurrency} error: {error}")
    return "\n".join(lines + [f"  note: {note}" for note in run.notes])


def format_comparison(report: ServeReport) -> str:
    target, baseline = report.run(report.target), report.run(BASELINE)
    if target is None or baseline is None:
        return ""
    ratios = improvement_ratios(target, baseline)
    lines = [
        f"== output tok/s: {report.target} vs {BASELINE} ==",
        f"{'conc':>4} {report.target:>12} {BASELINE:>12} {'ratio':>8}",
    ]
    for level in target.levels:
        other = baseline.level(level.concurrency)
        hf = "-" if other is None else f"{other.metrics.output_throughput:.1f}"
        ratio = ratios.get(level.concurrency)
        shown = "-" if ratio is None else f"{ratio:.2f}x"
        lines.append(
            f"{level.concurrency:>4} {level.metrics.output_throughput:>12.1f} {hf:>12} {shown:>8}"
        )
    return "\n".join(lines)


def print_report(report: ServeReport) -> None:
    for run in report.runs:
        print("\n" + format_run(run))
    comparison = format_comparison(report)
    if comparison:
        print("\n" + comparison)


def _plot_metric(axis: Any, report: ServeReport, value: Any, title: str, ylabel: str) -> None:
    levels: set[int] = set()
    for run in report.runs:
        points = [(lv.concurrency, value(lv.metrics)) for lv in run.levels]
        points = [(x, y) for x, y in points if y is not None]
        if points:
            axis.plot(*zip(*points, strict=True), marker="o", label=run.label)
            levels.update(x for x, _ in points)
    axis.set_xticks(sorted(levels))
    axis.set_title(title)
    axis.set_xlabel("concurrent users")
    axis.set_ylabel(ylabel)
    axis.grid(True, alpha=0.3)
    if axis.get_legend_handles_labels()[0]:
        axis.legend()


def write_png(report: ServeReport, path: Path) -> bool:
    """Throughput and TTFT/TPOT medians against concurrency; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    except ImportError:
        return False
    figure, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    _plot_metric(axes[0], report, lambda m: m.output_throughput, "output throughput", "tok/s")
    _plot_metric(axes[1], report, lambda m: m.ttft.median_ms, "TTFT median", "ms")
    _plot_metric(axes[2], report, lambda m: m.tpot.median_ms, "TPOT median", "ms")
    axes[0].set_ylim(bottom=0)
    for axis in axes[1:]:  # queueing makes a serial server's TTFT grow by orders of magnitude
        axis.set_yscale("log")
        axis.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        axis.yaxis.set_minor_formatter(NullFormatter())
    ratios = report_ratios(report)
    if ratios:
        top = max(ratios)
        figure.suptitle(
            f"{report.target} vs {BASELINE}: {ratios[top]:.1f}x output tok/s at {top} users"
        )
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True
