"""The embeddings benchmark's report: text table, JSON and a bar chart."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from octavo_bench.report import machine_info, ratio, table


@dataclass
class WorkloadResult:
    name: str
    octavo_inputs_per_s: list[float] = field(default_factory=list)
    st_inputs_per_s: list[float] = field(default_factory=list)
    max_abs_diff: float = 0.0  # largest difference between the two engines' vectors
    tokens: int = 0  # tokens of one repeat's inputs
    vllm_inputs_per_s: list[float] = field(default_factory=list)  # empty: not measured
    vllm_max_abs_diff: float | None = None  # vLLM's largest difference from sentence-transformers

    @property
    def octavo(self) -> float:
        return statistics.median(self.octavo_inputs_per_s)

    @property
    def sentence_transformers(self) -> float:
        return statistics.median(self.st_inputs_per_s)

    @property
    def speedup(self) -> float | None:
        return ratio(self.octavo, self.sentence_transformers)

    @property
    def vllm(self) -> float | None:
        return statistics.median(self.vllm_inputs_per_s) if self.vllm_inputs_per_s else None

    @property
    def vllm_speedup(self) -> float | None:
        return None if self.vllm is None else ratio(self.octavo, self.vllm)


@dataclass
class EmbeddingReport:
    model: str
    dtype: str
    batch_size: int
    threads: int
    workloads: list[WorkloadResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    vllm: dict = field(default_factory=dict)  # vLLM's set-up, version, load time (if run)

    def to_json(self) -> dict[str, Any]:
        entries = [
            {
                **asdict(w),
                "octavo_median": w.octavo,
                "st_median": w.sentence_transformers,
                "speedup": w.speedup,
                "vllm_median": w.vllm,
                "speedup_vs_vllm": w.vllm_speedup,
            }
            for w in self.workloads
        ]
        return {
            "benchmark": "embeddings",
            "model": self.model,
            "dtype": self.dtype,
            "batch_size": self.batch_size,
            "threads": self.threads,
            "machine": machine_info(),
            "workloads": entries,
            "vllm": self.vllm,
            "notes": self.notes,
        }

    def text(self) -> str:
        rows = [
            [
                w.name,
                f"{w.octavo:.1f}",
                f"{w.sentence_transformers:.1f}",
                f"{w.speedup:.2f}x" if w.speedup else "-",
                f"{w.max_abs_diff:.1e}",
                "-" if w.vllm is None else f"{w.vllm:.1f}",
                f"{w.vllm_speedup:.2f}x" if w.vllm_speedup else "-",
                "-" if w.vllm_max_abs_diff is None else f"{w.vllm_max_abs_diff:.1e}",
            ]
            for w in self.workloads
        ]
        headers = [
            "workload",
            "octavo inputs/s",
            "sentence-transformers inputs/s",
            "ratio",
            "max |diff|",
            "vllm inputs/s",
            "octavo / vllm",
            "vllm max |diff|",
        ]
        title = (
            f"embeddings: {self.model}, {self.dtype}, batch {self.batch_size}, "
            f"{self.threads} threads"
        )
        return "\n".join([title, table(headers, rows), *self.notes])

    def draw(self, plt: Any) -> Any:
        figure, axis = plt.subplots(figsize=(6, 4))
        names = [w.name for w in self.workloads]
        positions = range(len(names))
        series = [
            ("octavo", [w.octavo for w in self.workloads]),
            ("sentence-transformers", [w.sentence_transformers for w in self.workloads]),
        ]
        if any(w.vllm for w in self.workloads):
            series.append(("vllm", [w.vllm or 0.0 for w in self.workloads]))
        width = 0.8 / len(series)
        for index, (label, values) in enumerate(series):
            offset = (index - (len(series) - 1) / 2) * width
            axis.bar([p + offset for p in positions], values, width, label=label)
        axis.set_xticks(list(positions), names)
        axis.set_ylabel("inputs/s (median)")
        axis.set_title(f"embeddings, batch {self.batch_size}")
        axis.legend()
        return figure
