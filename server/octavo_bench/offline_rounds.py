"""`offline --rounds N`: Octavo and vLLM take turns N times on the workloads both run, so
that a machine whose speed drifts biases neither engine (on a shared 2-vCPU VM the same
Octavo run of (e) gave 105-143 tok/s within five minutes: all of Octavo's workloads, then
all of vLLM's, compared whatever the machine was doing in each).

Each round pairs, workload by workload, an Octavo run with the vLLM run right after it
(vllm_turns). A workload's ratio is the median of its rounds' ratios; each engine's row
shows its median run (by tok/s), with that run's latency and KV figures. Every round's
figures are in the JSON (``rounds``) and printed under the table.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from octavo_bench.report import OCTAVO, BenchReport, RunResult, ratio


@dataclass
class Rounds:
    """Every round's run of each (workload, engine), in round order."""

    workloads: list[str]
    runs: dict[tuple[str, str], list[RunResult]] = field(default_factory=dict)

    def add(self, result: RunResult) -> None:
        self.runs.setdefault((result.workload, result.engine), []).append(result)

    def engines(self, workload: str) -> list[str]:
        return [engine for (name, engine) in self.runs if name == workload]

    def median_run(self, workload: str, engine: str) -> RunResult:
        """The run with the median tok/s (the lower of the middle two for an even count)."""
        runs = sorted(self.runs[(workload, engine)], key=lambda run: run.tok_s)
        return runs[(len(runs) - 1) // 2]

    def paired_ratios(self, workload: str, baseline: str) -> list[float]:
        """Octavo's tok/s over the baseline's, round by round."""
        ours = self.runs.get((workload, OCTAVO), [])
        theirs = self.runs.get((workload, baseline), [])
        pairs = zip(ours, theirs, strict=False)
        return [value for a, b in pairs if (value := ratio(a.tok_s, b.tok_s)) is not None]

    def median_ratio(self, workload: str, baseline: str) -> float | None:
        ratios = self.paired_ratios(workload, baseline)
        return statistics.median(ratios) if ratios else None

    def settle(self, report: BenchReport) -> None:
        """Put each (workload, engine)'s median run in the report, in place of the run it
        had or after the others."""
        settled = {(r.workload, r.engine) for r in report.results}
        report.results = [
            self.median_run(r.workload, r.engine) if (r.workload, r.engine) in self.runs else r
            for r in report.results
        ]
        report.results += [self.median_run(*key) for key in self.runs if key not in settled]
        report.rounds = self

    def to_json(self, workload: str) -> dict[str, Any] | None:
        if workload not in self.workloads:
            return None
        engines = self.engines(workload)
        tok_s = {e: [round(run.tok_s, 2) for run in self.runs[(workload, e)]] for e in engines}
        ratios = {
            f"{OCTAVO}/{b}": [round(value, 4) for value in self.paired_ratios(workload, b)]
            for b in engines
            if b != OCTAVO
        }
        return {"tok_s": tok_s, "ratios": ratios}

    def lines(self) -> list[str]:
        """A line per workload and baseline: each round's ratio, then the median."""
        count = max((len(runs) for runs in self.runs.values()), default=0)
        lines = [f"\nRounds ({count}): Octavo / baseline of the same round, then the median"]
        for workload in self.workloads:
            for baseline in (e for e in self.engines(workload) if e != OCTAVO):
                ratios = self.paired_ratios(workload, baseline)
                shown = " ".join(f"{value:.2f}x" for value in ratios)
                median = self.median_ratio(workload, baseline)
                tail = "" if median is None else f" -> {median:.2f}x"
                lines.append(f"  ({workload}) vs {baseline}: {shown}{tail}")
        return lines
