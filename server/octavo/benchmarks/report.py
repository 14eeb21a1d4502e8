"""Collecting, printing and saving the offline benchmark's figures (table, JSON, PNG)."""

from __future__ import annotations

import datetime
import json
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

import torch

from octavo.benchmarks.capacity import SequencesThatFit
from octavo.benchmarks.results import RunResult
from octavo.benchmarks.workloads import Workload

OCTAVO = "octavo"
OCTAVO_NO_CACHE = "octavo-no-prefix-cache"


@dataclass
class BenchReport:
    machine: dict
    config: dict
    workloads: dict[str, Workload]
    results: list[RunResult] = field(default_factory=list)
    fits: dict[str, SequencesThatFit] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def result(self, workload: str, engine: str) -> RunResult | None:
        for result in self.results:
            if result.workload == workload and result.engine == engine:
                return result
        return None

    def engines(self, workload: str) -> list[str]:
        return [result.engine for result in self.results if result.workload == workload]

    def baselines(self, workload: str) -> list[str]:
        return [e for e in self.engines(workload) if e not in (OCTAVO, OCTAVO_NO_CACHE)]


def machine_info(dtype: torch.dtype) -> dict:
    import transformers

    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "torch_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "dtype": str(dtype).removeprefix("torch."),
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


def throughput_ratios(report: BenchReport, workload: str) -> dict[str, float]:
    """Octavo tok/s over each baseline's tok/s for this workload."""
    octavo = report.result(workload, OCTAVO)
    ratios = {}
    for engine in report.baselines(workload):
        baseline = report.result(workload, engine)
        if octavo is not None and baseline is not None and baseline.tok_s > 0:
            ratios[f"{OCTAVO}/{engine}"] = octavo.tok_s / baseline.tok_s
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
        "tok_s_on/off": on.tok_s / off.tok_s if off.tok_s > 0 else 0.0,
    }


def workload_entry(report: BenchReport, name: str) -> dict:
    entry = {
        "workload": report.workloads[name].summary(),
        "results": {r.engine: r.as_dict() for r in report.results if r.workload == name},
        "ratios": prefix_cache_ratios(report) if name == "d" else throughput_ratios(report, name),
    }
    octavo = report.result(name, OCTAVO)
    if name in report.fits and octavo is not None:
        utilisation = octavo.kv_utilisation_mean
        entry["kv"] = {
            "utilisation_mean": utilisation,
            "waste_pct": None if utilisation is None else 100.0 * (1.0 - utilisation),
            "sequences_that_fit": report.fits[name].as_dict(),
        }
    return entry


def to_json(report: BenchReport) -> dict:
    return {
        "machine": report.machine,
        "config": report.config,
        "notes": report.notes,
        "workloads": {name: workload_entry(report, name) for name in report.workloads},
    }


def write_json(report: BenchReport, path: Path) -> None:
    path.write_text(json.dumps(to_json(report), indent=2) + "\n")


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)]
    lines = [headers, ["-" * width for width in widths], *rows]
    return "\n".join(
        "  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)) for line in lines
    )


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
    return _table(headers, rows)


def kv_table(report: BenchReport) -> str:
    headers = [
        "workload",
        "KV util (mean)",
        "waste",
        "mean seq len",
        "contiguous fit",
        "paged fit",
        "peak running",
        "preemptions",
    ]
    rows = []
    for name, fit in report.fits.items():
        result = report.result(name, OCTAVO)
        utilisation = result.kv_utilisation_mean if result else None
        shown = "n/a" if utilisation is None else f"{utilisation:.3f}"
        waste = "n/a" if utilisation is None else f"{100 * (1 - utilisation):.1f}%"
        rows.append(
            [
                name,
                shown,
                waste,
                f"{fit.mean_sequence_tokens:.0f}",
                str(fit.contiguous),
                str(fit.paged),
                str(fit.peak_running_measured),
                str(result.num_preemptions if result else ""),
            ]
        )
    return _table(headers, rows)


def prefix_table(report: BenchReport) -> str:
    headers = ["prefix cache", "TTFT mean (s)", "TTFT median (s)", "out tok/s", "hit rate"]
    rows = []
    for label, engine in (("on", OCTAVO), ("off", OCTAVO_NO_CACHE)):
        result = report.result("d", engine)
        if result is None or not result.ttft_s:
            continue
        ttft, rate = result.ttft_summary(), result.prefix_cache_hit_rate
        rows.append(
            [
                label,
                f"{ttft['mean']:.4f}",
                f"{ttft['median']:.4f}",
                f"{result.tok_s:.1f}",
                "n/a" if rate is None else f"{100 * rate:.1f}%",
            ]
        )
    ratios = prefix_cache_ratios(report)
    if ratios:
        rows.append(
            [
                "ratio off/on",
                f"{ratios['ttft_mean_off/on']:.2f}x",
                f"{ratios['ttft_median_off/on']:.2f}x",
                "",
                "",
            ]
        )
    return _table(headers, rows)


def print_report(report: BenchReport) -> None:
    machine = report.machine
    print(
        f"\nOctavo offline benchmark: {report.config['model']} ({machine['dtype']}), "
        f"{machine['cpu_count']} CPUs, torch {machine['torch_version']}"
    )
    for name, workload in report.workloads.items():
        print(f"  ({name}) {workload.description}")
    print("\nThroughput (output tokens / wall time; ratio = Octavo / baseline)")
    print(throughput_table(report))
    if report.fits:
        print("\nKV cache (utilisation = tokens held / slots allocated, mean over steps;")
        print(" fit = sequences of the workload's mean length that the KV budget holds)")
        print(kv_table(report))
    if report.result("d", OCTAVO) or report.result("d", OCTAVO_NO_CACHE):
        print("\n(d) shared system prompt: prefix cache on vs off")
        print(prefix_table(report))
    for note in report.notes:
        print(f"note: {note}")


def write_png(report: BenchReport, path: Path) -> bool:
    """Grouped bars of tok/s per workload per engine; False if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
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
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True
