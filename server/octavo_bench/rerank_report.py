"""The rerank benchmark's report: one row per engine (pairs/s, ratio, score difference),
as a text table, JSON and a bar chart."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from octavo_bench.report import machine_info, ratio, table

OCTAVO = "octavo"
SENTENCE_TRANSFORMERS = "sentence-transformers"
VLLM = "vllm"
ENGINES = (OCTAVO, SENTENCE_TRANSFORMERS, VLLM)


@dataclass
class EngineResult:
    """One engine's pairs/s per repeat and its largest |score - sentence-transformers'|."""

    engine: str
    pairs_per_s: list[float] = field(default_factory=list)
    max_abs_diff: float | None = None  # None for sentence-transformers itself
    skipped: str = ""  # why the engine was not measured

    @property
    def median(self) -> float:
        return statistics.median(self.pairs_per_s) if self.pairs_per_s else 0.0


@dataclass
class RerankReport:
    model: str
    dtype: str
    threads: int
    queries: int
    documents: int
    batch_size: int
    engines: list[EngineResult] = field(default_factory=list)
    vllm: dict = field(default_factory=dict)  # vLLM's set-up, version, load time
    notes: list[str] = field(default_factory=list)

    def result(self, engine: str) -> EngineResult | None:
        return next((e for e in self.engines if e.engine == engine), None)

    def ratio_to(self, engine: EngineResult, baseline: str) -> float | None:
        other = self.result(baseline)
        if other is None or not engine.pairs_per_s or not other.pairs_per_s:
            return None
        return ratio(engine.median, other.median)

    def to_json(self) -> dict[str, Any]:
        entries = [
            {
                **asdict(e),
                "median_pairs_per_s": e.median,
                "ratio_to_sentence_transformers": self.ratio_to(e, SENTENCE_TRANSFORMERS),
                "ratio_to_vllm": self.ratio_to(e, VLLM),
            }
            for e in self.engines
        ]
        return {
            "benchmark": "rerank",
            "model": self.model,
            "dtype": self.dtype,
            "threads": self.threads,
            "queries": self.queries,
            "documents_per_query": self.documents,
            "st_batch_size": self.batch_size,
            "machine": machine_info(),
            "engines": entries,
            "vllm": self.vllm,
            "notes": self.notes,
        }

    def text(self) -> str:
        rows = [self._row(e) for e in self.engines]
        headers = ["engine", "pairs/s", "octavo / engine", "max |score diff| vs ST", "note"]
        title = (
            f"rerank: {self.model}, {self.dtype}, {self.threads} threads, {self.queries} "
            f"queries x {self.documents} documents"
        )
        return "\n".join([title, table(headers, rows), *self.notes])

    def _row(self, engine: EngineResult) -> list[str]:
        octavo = self.result(OCTAVO)
        speedup = None if octavo is None else self.ratio_to(octavo, engine.engine)
        return [
            engine.engine,
            f"{engine.median:.1f}" if engine.pairs_per_s else "-",
            f"{speedup:.2f}x" if speedup else "-",
            "-" if engine.max_abs_diff is None else f"{engine.max_abs_diff:.1e}",
            engine.skipped and f"not measured: {engine.skipped}",
        ]

    def draw(self, plt: Any) -> Any:
        figure, axis = plt.subplots(figsize=(6, 4))
        measured = [e for e in self.engines if e.pairs_per_s]
        axis.bar([e.engine for e in measured], [e.median for e in measured])
        axis.set_ylabel("query-document pairs/s (median)")
        axis.set_title(f"rerank, {self.documents} documents per query, {self.dtype}")
        return figure
