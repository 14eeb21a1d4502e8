"""What one engine's run of one workload measured."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field


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

    def as_dict(self) -> dict:
        utilisation = self.kv_utilisation_mean
        return {
            "engine": self.engine,
            "num_requests": self.num_requests,
            "output_tokens": self.output_tokens,
            "generated_tokens": self.generated_tokens or self.output_tokens,
            "wall_s": round(self.wall_s, 4),
            "tok_s": round(self.tok_s, 2),
            "ttft_s": self.ttft_summary(),
            "kv_utilisation_mean": utilisation,
            "kv_waste_pct": None if utilisation is None else 100.0 * (1.0 - utilisation),
            "kv_samples": len(self.kv_utilisation),
            "peak_running": self.peak_running,
            "num_preemptions": self.num_preemptions,
            "prefix_cache_hit_rate": self.prefix_cache_hit_rate,
            "note": self.note,
        }
