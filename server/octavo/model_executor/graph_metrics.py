"""``--cudagraph-metrics`` (vLLM's flag): which graphs the steps replayed, and their padding.

Each forward is one observation, as vLLM's ``CUDAGraphStat``: the step's tokens, the
tokens of what ran (the capture size it was padded to; the same when it ran eagerly) and
the runtime mode: ``FULL`` (a decode graph, attention inside), ``PIECEWISE`` (graphs cut
at attention) or ``NONE`` (eager). Every ``interval`` seconds that saw steps, one log
record gives what was captured and a table of the observations, most frequent first, laid
out as vLLM's ``CUDAGraphLogging`` lays it out. On CPU the decode graphs are the recorded
op calls (``cpu_graphs``); the table reads the same.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

LOG_INTERVAL_SECONDS = 10.0  # as vLLM's stats logging
HEADERS = ("Unpadded Tokens", "Padded Tokens", "Num Paddings", "Runtime Mode", "Count")
FULL, PIECEWISE, NONE = "FULL", "PIECEWISE", "NONE"


@dataclass(frozen=True)
class GraphStat:
    """One forward: its tokens, the tokens of the graph it replayed, and how it ran."""

    unpadded_tokens: int
    padded_tokens: int
    runtime_mode: str

    @property
    def paddings(self) -> int:
        return self.padded_tokens - self.unpadded_tokens


@dataclass
class GraphMetricsLog:
    """Counts the forwards' ``GraphStat`` and logs them every ``interval`` seconds."""

    settings: str  # what was captured (``captured_graphs``)
    interval: float = LOG_INTERVAL_SECONDS
    counts: Counter[GraphStat] = field(default_factory=Counter)
    last_time: float = field(default_factory=time.monotonic)

    def observe(self, tokens: int, size: int | None, mode: str) -> None:
        """A forward of ``tokens`` that ran in ``mode``, padded to ``size`` (None: eager)."""
        self.counts[GraphStat(tokens, tokens if size is None else size, mode)] += 1
        now = time.monotonic()
        if now - self.last_time >= self.interval:
            logger.info("%s", self.report())
            self.counts.clear()
            self.last_time = now

    def report(self) -> str:
        """The settings and the table of what was observed since the last report."""
        rows = [
            (str(s.unpadded_tokens), str(s.padded_tokens), str(s.paddings), s.runtime_mode, str(n))
            for s, n in self.counts.most_common()
        ]
        widths = [max(len(cell) for cell in column) for column in zip(HEADERS, *rows, strict=True)]
        lines = [_row(HEADERS, widths), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
        lines += [_row(row, widths) for row in rows]
        return f"graph metrics: {self.settings}\n" + "\n".join(lines)


def _row(cells: tuple[str, ...], widths: list[int]) -> str:
    return (
        "| "
        + " | ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True))
        + " |"
    )


def captured_graphs(decode_sizes: list[int] | None, piecewise_sizes: list[int] | None) -> str:
    """What a report's steps could replay: the decode and piecewise capture sizes."""
    parts = []
    if decode_sizes:
        parts.append(f"decode graphs ({FULL}) of {_sizes(decode_sizes)} rows")
    if piecewise_sizes:
        parts.append(f"graphs cut at attention ({PIECEWISE}) of {_sizes(piecewise_sizes)} tokens")
    return "; ".join(parts) if parts else f"no graphs captured: every step eager ({NONE})"


def _sizes(sizes: list[int]) -> str:
    return ", ".join(map(str, sizes))
