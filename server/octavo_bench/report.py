"""The benchmarks' results and how both benchmarks report them: text, JSON and PNG.

``offline`` fills a ``BenchReport`` with one ``RunResult`` per engine and workload;
``serve`` fills a ``ServeReport`` with one ``ServerRun`` (a ``LevelResult`` per
concurrency level) per server. ``save`` writes either the same way: its tables on
stdout, ``<stem>.json``, and ``<stem>.png`` (matplotlib, from the ``bench`` extra; a
note in the JSON instead when it is missing).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from octavo_bench.capacity import SequencesThatFit
from octavo_bench.serve_metrics import LevelMetrics, RequestRecord, Summary
from octavo_bench.serve_table import serving_table
from octavo_bench.workloads import Workload

OCTAVO = "octavo"  # Octavo's label in both benchmarks (the served one's by default)
OCTAVO_NO_CACHE = "octavo-no-prefix-cache"
HF = "hf"  # the serve benchmark's naive HF server
VLLM = "vllm"  # vLLM's CPU build, from its own venv (both benchmarks)


class Report(Protocol):
    notes: list[str]

    def to_json(self) -> dict[str, Any]: ...

    def text(self) -> str: ...

    def draw(self, plt: Any) -> Any:
        """A matplotlib figure of the report."""


# ----- saving -----------------------------------------------------------------------------
def save(report: Report, output_dir: Path, stem: str) -> None:
    """Print the report's tables, write ``stem.json`` and, with matplotlib, ``stem.png``."""
    output_dir.mkdir(parents=True, exist_ok=True)
    plt = pyplot()
    if plt is None:
        report.notes.append("matplotlib is not installed (the bench extra): no PNG written")
    json_path, png_path = output_dir / f"{stem}.json", output_dir / f"{stem}.png"
    json_path.write_text(json.dumps(json_safe(report.to_json()), indent=2, allow_nan=False) + "\n")
    print(report.text())
    if plt is None:
        print(f"\nwrote {json_path} (no PNG: matplotlib missing)")
        return
    figure = report.draw(plt)
    figure.tight_layout()
    figure.savefig(png_path, dpi=120)
    plt.close(figure)
    print(f"\nwrote {json_path} and {png_path}")


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the file-only Agg backend, or None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def json_safe(value: Any) -> Any:
    """Non-finite floats (``--request-rate inf``) become the strings ``"inf"``/``"nan"``."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value


def machine_info(**extra: Any) -> dict[str, Any]:
    """The machine the benchmark ran on, plus ``extra`` (the offline run's torch set-up)."""
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        **extra,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def table(headers: list[str], rows: list[list[str]]) -> str:
    """Left-aligned columns as wide as their widest cell."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)]
    lines = [headers, ["-" * width for width in widths], *rows]
    return "\n".join(
        "  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 else None


# ----- offline: one RunResult per engine and workload -------------------------------------
@dataclass
class RunResult:
    """Throughput (and, for Octavo, latency and KV figures) of one workload on one engine.

    ``output_tokens`` counts the tokens the workload asked for; ``generated_tokens`` what
    the engine actually computed (larger for static batches padded to their longest request).
    """

    engine: str
    workload: str
    num_requests: int
    output_tokens: int
    wall_s: float
    generated_tokens: int | None = None
    ttft_s: list[float] = field(default_factory=list)
    kv_utilisation: list[float] = field(default_factory=list)  # tokens held / slots, per step
    peak_running: int = 0
    num_preemptions: int = 0
    prefix_cache_hit_rate: float | None = None
    note: str = ""

    @property
    def tok_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def kv_utilisation_mean(self) -> float | None:
        return statistics.fmean(self.kv_utilisation) if self.kv_utilisation else None

    def ttft_summary(self) -> dict[str, float] | None:
        """Mean, median and p90 time to first token in seconds, if measured."""
        if not self.ttft_s:
            return None
        ordered = sorted(self.ttft_s)
        return {
            "mean": statistics.fmean(ordered),
            "median": statistics.median(ordered),
            "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "num_requests": self.num_requests,
            "output_tokens": self.output_tokens,
            "generated_tokens": self.generated_tokens or self.output_tokens,
            "wall_s": round(self.wall_s, 4),
            "tok_s": round(self.tok_s, 2),
            "ttft_s": self.ttft_summary(),
            **kv_figures(self.kv_utilisation_mean, "kv_utilisation_mean", "kv_waste_pct"),
            "kv_samples": len(self.kv_utilisation),
            "peak_running": self.peak_running,
            "num_preemptions": self.num_preemptions,
            "prefix_cache_hit_rate": self.prefix_cache_hit_rate,
            "note": self.note,
        }


def kv_figures(utilisation: float | None, mean_key: str, waste_key: str) -> dict[str, Any]:
    waste = None if utilisation is None else 100.0 * (1.0 - utilisation)
    return {mean_key: utilisation, waste_key: waste}


@dataclass
class BenchReport:
    machine: dict
    config: dict
    workloads: dict[str, Workload]
    results: list[RunResult] = field(default_factory=list)
    fits: dict[str, SequencesThatFit] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    rounds: Any = None  # offline_rounds.Rounds where --rounds > 1

    def result(self, workload: str, engine: str) -> RunResult | None:
        found = (r for r in self.results if r.workload == workload and r.engine == engine)
        return next(found, None)

    def baselines(self, workload: str) -> list[str]:
        return [
            result.engine
            for result in self.results
            if result.workload == workload and result.engine not in (OCTAVO, OCTAVO_NO_CACHE)
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "machine": self.machine,
            "config": self.config,
            "notes": self.notes,
            "workloads": {name: workload_entry(self, name) for name in self.workloads},
        }

    def text(self) -> str:
        return offline_text(self)

    def draw(self, plt: Any) -> Any:
        return offline_figure(self, plt)


def throughput_ratios(report: BenchReport, workload: str) -> dict[str, float]:
    """Octavo tok/s over each baseline's tok/s for this workload (with --rounds: the
    median of the rounds' ratios)."""
    octavo = report.result(workload, OCTAVO)
    ratios = {}
    for engine in report.baselines(workload):
        baseline = report.result(workload, engine)
        value = None if octavo is None or baseline is None else ratio(octavo.tok_s, baseline.tok_s)
        paired = report.rounds.median_ratio(workload, engine) if report.rounds else None
        value = paired if paired is not None else value
        if value is not None:
            ratios[f"{OCTAVO}/{engine}"] = value
    return ratios


def prefix_cache_ratios(report: BenchReport) -> dict[str, float]:
    """(d): TTFT with the prefix cache off over on (mean, median), and tok/s on over off."""
    on, off = report.result("d", OCTAVO), report.result("d", OCTAVO_NO_CACHE)
    if on is None or off is None or not on.ttft_s or not off.ttft_s:
        return {}
    on_ttft, off_ttft = on.ttft_summary(), off.ttft_summary()
    return {
        "ttft_mean_off/on": off_ttft["mean"] / on_ttft["mean"],
        "ttft_median_off/on": off_ttft["median"] / on_ttft["median"],
        "tok_s_on/off": ratio(on.tok_s, off.tok_s) or 0.0,
    }


def workload_entry(report: BenchReport, name: str) -> dict[str, Any]:
    entry = {
        "workload": report.workloads[name].summary(),
        "results": {r.engine: r.to_json() for r in report.results if r.workload == name},
        "ratios": prefix_cache_ratios(report) if name == "d" else throughput_ratios(report, name),
    }
    rounds = report.rounds.to_json(name) if report.rounds is not None else None
    if rounds is not None:
        entry["rounds"] = rounds
    octavo = report.result(name, OCTAVO)
    if name in report.fits and octavo is not None:
        entry["kv"] = {
            **kv_figures(octavo.kv_utilisation_mean, "utilisation_mean", "waste_pct"),
            "sequences_that_fit": report.fits[name].as_dict(),
        }
    return entry


def throughput_table(report: BenchReport) -> str:
    baselines = list(dict.fromkeys(e for w in report.workloads for e in report.baselines(w)))
    headers = ["workload", "engine", "tok/s", *[f"vs {b}" for b in baselines]]
    rows = []
    for result in report.results:
        ratios = throughput_ratios(report, result.workload) if result.engine == OCTAVO else {}
        cells = [ratios.get(f"{OCTAVO}/{b}") for b in baselines]
        rows.append(
            [result.workload, result.engine, f"{result.tok_s:.1f}"]
            + ["" if c is None else f"{c:.2f}x" for c in cells]
        )
    return table(headers, rows)


def versus_lines(report: BenchReport, baseline: str, shown_as: str) -> list[str]:
    """One line per workload both ran: Octavo's tok/s over ``baseline``'s (with --rounds:
    the median runs, and the median of the rounds' ratios)."""
    lines = []
    for name in report.workloads:
        octavo, other = report.result(name, OCTAVO), report.result(name, baseline)
        value = throughput_ratios(report, name).get(f"{OCTAVO}/{baseline}")
        if octavo is not None and other is not None and value is not None:
            lines.append(f"  ({name}) {octavo.tok_s:.1f} / {other.tok_s:.1f} tok/s = {value:.2f}x")
    if not lines:
        return []
    rounds = ", medians of the rounds" if report.rounds is not None else ""
    return [f"\nOctavo / {shown_as} (output tok/s, same prompts and lengths{rounds})", *lines]


def kv_table(report: BenchReport) -> str:
    headers = ["workload", "KV util (mean)", "waste", "mean seq len"]
    headers += ["contiguous fit", "paged fit", "peak running", "preemptions"]
    rows = []
    for name, fit in report.fits.items():
        result = report.result(name, OCTAVO)
        utilisation = result.kv_utilisation_mean if result else None
        shown = "n/a" if utilisation is None else f"{utilisation:.3f}"
        waste = "n/a" if utilisation is None else f"{100 * (1 - utilisation):.1f}%"
        preemptions = str(result.num_preemptions) if result else ""
        counts = (fit.contiguous, fit.paged, fit.peak_running_measured)
        rows.append(
            [name, shown, waste, f"{fit.mean_sequence_tokens:.0f}", *map(str, counts), preemptions]
        )
    return table(headers, rows)


def prefix_table(report: BenchReport) -> str:
    headers = ["prefix cache", "TTFT mean (s)", "TTFT median (s)", "out tok/s", "hit rate"]
    rows = []
    for label, engine in (("on", OCTAVO), ("off", OCTAVO_NO_CACHE)):
        result = report.result("d", engine)
        if result is None or not result.ttft_s:
            continue
        ttft, rate = result.ttft_summary(), result.prefix_cache_hit_rate
        hit_rate = "n/a" if rate is None else f"{100 * rate:.1f}%"
        rows.append(
            [label, f"{ttft['mean']:.4f}", f"{ttft['median']:.4f}", f"{result.tok_s:.1f}", hit_rate]
        )
    ratios = prefix_cache_ratios(report)
    if ratios:
        mean, median = ratios["ttft_mean_off/on"], ratios["ttft_median_off/on"]
        rows.append(["ratio off/on", f"{mean:.2f}x", f"{median:.2f}x", "", ""])
    return table(headers, rows)


def offline_text(report: BenchReport) -> str:
    machine = report.machine
    lines = [
        f"\nOctavo offline benchmark: {report.config['model']} ({machine['dtype']}), "
        f"{machine['cpu_count']} CPUs, torch {machine['torch_version']}",
        *(f"  ({name}) {workload.description}" for name, workload in report.workloads.items()),
        "\nThroughput (output tokens / wall time; ratio = Octavo / baseline)",
        throughput_table(report),
        *versus_lines(report, VLLM, "vLLM"),
        *(report.rounds.lines() if report.rounds is not None else []),
    ]
    if report.fits:
        lines.append("\nKV cache (utilisation = tokens held / slots allocated, mean over steps;")
        lines += [" fit = sequences of the workload's mean length that the KV budget holds)"]
        lines.append(kv_table(report))
    if report.result("d", OCTAVO) or report.result("d", OCTAVO_NO_CACHE):
        lines += ["\n(d) shared system prompt: prefix cache on vs off", prefix_table(report)]
    return "\n".join(lines + [f"note: {note}" for note in report.notes])


def offline_figure(report: BenchReport, plt: Any) -> Any:
    """Grouped bars of tok/s per workload per engine."""
    names = list(report.workloads)
    engines = list(dict.fromkeys(result.engine for result in report.results))
    width = 0.8 / max(1, len(engines))
    figure, axes = plt.subplots(figsize=(max(6, 2 * len(names) + 2), 4.5))
    for index, engine in enumerate(engines):
        values = [(r.tok_s if (r := report.result(n, engine)) else 0.0) for n in names]
        positions = [i + (index - (len(engines) - 1) / 2) * width for i in range(len(names))]
        label = f"{engine} (prefix cache on in d)" if engine == OCTAVO else engine
        bars = axes.bar(positions, values, width, label=label)
        axes.bar_label(bars, labels=[f"{v:.0f}" if v else "" for v in values], fontsize=7)
    axes.set_xticks(range(len(names)), [f"({n})" for n in names])
    axes.set_ylabel("output tokens / s")
    axes.set_title(
        f"Octavo offline throughput ({Path(report.config['model']).name}, "
        f"{report.machine['dtype']}, {report.machine['cpu_count']} CPUs)"
    )
    axes.legend(fontsize="small")
    return figure


# ----- serve: one ServerRun per server, one LevelResult per concurrency level -------------
@dataclass
class LevelResult:
    """One concurrency level against one server: its figures and every request."""

    concurrency: int
    num_prompts: int
    metrics: LevelMetrics
    records: list[RequestRecord]
    server: dict[str, Any] | None = None  # peaks the server reported (serve_server_stats)
    vllm_client: dict[str, Any] | None = None  # vLLM's own client at the same load

    def errors(self) -> list[str]:
        return sorted({r.error for r in self.records if r.error})

    def to_json(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "num_prompts": self.num_prompts,
            **asdict(self.metrics),
            "server": self.server,
            "vllm_client": self.vllm_client,
            "errors": self.errors(),
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
    target: str = OCTAVO  # the label of the server under test
    machine: dict[str, Any] = field(default_factory=machine_info)  # the client's
    notes: list[str] = field(default_factory=list)

    def run(self, label: str) -> ServerRun | None:
        return next((run for run in self.runs if run.label == label), None)

    def baselines(self) -> list[str]:
        return [run.label for run in self.runs if run.label != self.target]

    def ratios(self, baseline: str) -> dict[int, float]:
        """Per concurrency level: target output tok/s over ``baseline``'s."""
        return {
            level: entry["output_tok_s_ratio"]
            for level, entry in self.comparison(baseline).items()
            if entry["output_tok_s_ratio"] is not None
        }

    def comparison(self, baseline: str) -> dict[int, dict[str, Any]]:
        """Per level both ran: the output tok/s ratio (target / baseline) and both TTFT p50s."""
        target, other = self.run(self.target), self.run(baseline)
        if target is None or other is None:
            return {}
        found = {}
        for level in target.levels:
            theirs = other.level(level.concurrency)
            if theirs is None:
                continue
            ours, others = level.metrics, theirs.metrics
            found[level.concurrency] = {
                "output_tok_s": {
                    self.target: ours.output_throughput,
                    baseline: others.output_throughput,
                },
                "output_tok_s_ratio": ratio(ours.output_throughput, others.output_throughput),
                "ttft_p50_ms": {self.target: ours.ttft.median_ms, baseline: others.ttft.median_ms},
            }
        return found

    def to_json(self) -> dict[str, Any]:
        definition = (
            f"per baseline and concurrency level: {self.target} output tok/s over the "
            "baseline's (output_tok_s_ratio), and both TTFT medians in ms"
        )
        return {
            "settings": self.settings,
            "machine": self.machine,
            "notes": self.notes,
            "servers": {run.label: run.to_json() for run in self.runs},
            "comparisons": {
                "definition": definition,
                "by_baseline": {name: self.comparison(name) for name in self.baselines()},
            },
        }

    def text(self) -> str:
        parts = [run_text(run) for run in self.runs]
        parts += [comparison_text(self, name) for name in self.baselines()]
        parts.append(serving_table(self.runs))
        parts += [f"note: {note}" for note in self.notes]
        return "\n" + "\n\n".join(filter(None, parts))

    def draw(self, plt: Any) -> Any:
        return serve_figure(self, plt)


def _triple(summary: Summary) -> str:
    values = (summary.mean_ms, summary.median_ms, summary.p99_ms)
    return "/".join("-" if v is None else f"{v:.1f}" for v in values)


def run_text(run: ServerRun) -> str:
    """Throughput and latency table of one server's sweep, then its errors and notes."""
    headers = ["conc", "ok", "fail", "dur s", "req/s", "out tok/s", "tot tok/s"]
    headers += ["TTFT ms", "TPOT ms", "ITL ms", "E2EL ms"]
    rows = []
    for level in run.levels:
        m = level.metrics
        rows.append(
            [str(level.concurrency), str(m.completed), str(m.failed), f"{m.duration_s:.2f}"]
            + [f"{m.request_throughput:.2f}", f"{m.output_throughput:.1f}"]
            + [f"{m.total_token_throughput:.1f}"]
            + [_triple(s) for s in (m.ttft, m.tpot, m.itl, m.e2el)]
        )
    lines = [f"== {run.label}: {run.base_url} (model {run.model}); latencies mean/median/p99 =="]
    lines.append(table(headers, rows))
    for level in run.levels:
        lines += [f"  concurrency {level.concurrency} error: {e}" for e in level.errors()]
    return "\n".join(lines + [f"  note: {note}" for note in run.notes])


def comparison_text(report: ServeReport, baseline: str) -> str:
    """``target / baseline`` per level: output tok/s and their ratio, TTFT p50 side by side."""
    target = report.target
    headers = ["conc", f"{target} tok/s", f"{baseline} tok/s", "ratio"]
    headers += [f"{target} TTFT p50 ms", f"{baseline} TTFT p50 ms"]
    rows = []
    for level, entry in report.comparison(baseline).items():
        tok_s, ttft = entry["output_tok_s"], entry["ttft_p50_ms"]
        value = entry["output_tok_s_ratio"]
        rows.append(
            [str(level), f"{tok_s[target]:.1f}", f"{tok_s[baseline]:.1f}"]
            + ["-" if value is None else f"{value:.2f}x"]
            + ["-" if ttft[name] is None else f"{ttft[name]:.0f}" for name in (target, baseline)]
        )
    if not rows:
        return ""
    title = f"== {target} / {baseline} per level: output tok/s, and TTFT p50 side by side =="
    return title + "\n" + table(headers, rows)


def serve_figure(report: ServeReport, plt: Any) -> Any:
    """Throughput and TTFT/TPOT medians against concurrency."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

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
    summary = []
    for name in report.baselines():
        ratios = report.ratios(name)
        if ratios:
            top = max(ratios)
            summary.append(f"{ratios[top]:.2f}x {name} at {top} users")
    if summary:
        figure.suptitle(f"{report.target} output tok/s: " + ", ".join(summary))
    return figure


def _plot_metric(
    axis: Any,
    report: ServeReport,
    value: Callable[[LevelMetrics], float | None],
    title: str,
    ylabel: str,
) -> None:
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
