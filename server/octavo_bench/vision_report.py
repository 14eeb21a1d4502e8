"""The vision benchmark's report: one row per workload, one column per engine, the
ratios, the encoder cache's effect; text, JSON and a two-panel bar chart."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from octavo_bench.report import HF, OCTAVO, VLLM, ratio, table
from octavo_bench.vision_workloads import ONE_IMAGE, REPEATED, THROUGHPUT, TTFT

ENGINES = (OCTAVO, HF, VLLM)


@dataclass
class VisionResult:
    """One engine on one workload: the batch's wall time (throughput) or each request's
    time to its single token (TTFT)."""

    engine: str
    workload: str
    kind: str
    num_requests: int
    images_per_request: int
    seconds: list[float]
    output_tokens: int = 0
    note: str = ""

    @property
    def value(self) -> float:
        """Requests/s (throughput) or the median TTFT in ms."""
        if self.kind == TTFT:
            return 1000 * statistics.median(self.seconds)
        return self.num_requests / self.seconds[0] if self.seconds[0] > 0 else 0.0


@dataclass
class VisionReport:
    machine: dict
    config: dict
    results: list[VisionResult] = field(default_factory=list)
    encoder_cache: dict[str, Any] = field(default_factory=dict)  # Octavo's hits and misses
    notes: list[str] = field(default_factory=list)

    def find(self, workload: str, engine: str) -> VisionResult | None:
        found = (r for r in self.results if r.workload == workload and r.engine == engine)
        return next(found, None)

    def workloads(self) -> list[tuple[str, str]]:
        """(name, kind) of every workload measured, in the order first measured."""
        return list(dict.fromkeys((r.workload, r.kind) for r in self.results))

    def speedup(self, workload: str, kind: str, other: str) -> float | None:
        """How many times faster Octavo is than ``other`` (req/s ratio, or TTFT inverse)."""
        ours, theirs = self.find(workload, OCTAVO), self.find(workload, other)
        if ours is None or theirs is None:
            return None
        if kind == TTFT:
            return ratio(theirs.value, ours.value)
        return ratio(ours.value, theirs.value)

    def cache_effect(self, engine: str) -> float | None:
        """Requests/s with one image repeated over requests/s with distinct images."""
        repeated, distinct = self.find(REPEATED, engine), self.find(ONE_IMAGE, engine)
        if repeated is None or distinct is None:
            return None
        return ratio(repeated.value, distinct.value)

    def to_json(self) -> dict[str, Any]:
        return {
            "benchmark": "vision",
            "machine": self.machine,
            "config": self.config,
            "results": [{**asdict(r), "value": r.value} for r in self.results],
            "speedups": {
                name: {other: self.speedup(name, kind, other) for other in (HF, VLLM)}
                for name, kind in self.workloads()
            },
            "repeated_vs_distinct": {engine: self.cache_effect(engine) for engine in ENGINES},
            "encoder_cache": self.encoder_cache,
            "notes": self.notes,
        }

    def text(self) -> str:
        headers = ["workload", "unit", *ENGINES, "octavo vs hf", "octavo vs vllm"]
        rows = [self.row(name, kind) for name, kind in self.workloads()]
        lines = [f"vision: {self.config.get('model')}", table(headers, rows), ""]
        for engine in ENGINES:
            effect = self.cache_effect(engine)
            if effect is not None:
                lines.append(
                    f"{engine}: one image repeated vs distinct images: {effect:.2f}x req/s"
                )
        if "load_average_1min" in self.config:
            lines.append(
                f"1-minute load average as each engine began: {self.config['load_average_1min']}"
            )
        if self.encoder_cache:
            lines.append(f"octavo encoder cache (images encoded = misses): {self.encoder_cache}")
        return "\n".join([*lines, *self.notes])

    def row(self, name: str, kind: str) -> list[str]:
        unit = "req/s" if kind == THROUGHPUT else "ms (median)"
        cells = []
        for engine in ENGINES:
            result = self.find(name, engine)
            cells.append("-" if result is None else f"{result.value:.2f}")
        speedups = [self.speedup(name, kind, other) for other in (HF, VLLM)]
        return [name, unit, *cells, *(f"{s:.2f}x" if s else "-" for s in speedups)]

    def draw(self, plt: Any) -> Any:
        figure, axes = plt.subplots(1, 2, figsize=(11, 4))
        for axis, kind, label in (
            (axes[0], THROUGHPUT, "requests/s (higher is better)"),
            (axes[1], TTFT, "TTFT ms, median (lower is better)"),
        ):
            self.draw_panel(axis, kind, label)
        figure.suptitle(f"vision: {self.config.get('model')}")
        return figure

    def draw_panel(self, axis: Any, kind: str, label: str) -> None:
        names = [name for name, k in self.workloads() if k == kind]
        width = 0.8 / len(ENGINES)
        for index, engine in enumerate(ENGINES):
            results = [self.find(name, engine) for name in names]
            values = [0.0 if r is None else r.value for r in results]
            positions = [p + (index - 1) * width for p in range(len(names))]
            axis.bar(positions, values, width, label=engine)
        axis.set_xticks(list(range(len(names))), names)
        axis.set_ylabel(label)
        axis.legend()
