"""The engine's state in the log every 10 seconds, in the words of vLLM's stats logging.

``Engine 000: Avg prompt throughput: 512.0 tokens/s, Avg generation throughput: 301.4
tokens/s, Running: 20 reqs, Waiting: 3 reqs, Preemptions: 1, CPU KV cache usage: 41.2%,
Prefix cache hit rate: 37.5%``: throughputs and preemptions over the interval, running and
waiting requests and the KV cache's use at its end, the prefix cache's hit rate over the
prompt tokens looked up in it (left out when none were). An idle engine's line (no tokens
in this interval or the one before) goes to the debug level, as vLLM's does, so an idle
server's log stays quiet. A line is due at the first step after the interval is over: an
engine with no steps writes none. ``--disable-log-stats`` turns it off, and with it the
speculative decoding and graph lines (``--cudagraph-metrics``), as in vLLM; the offline
``LLM`` class logs none unless asked (``disable_log_stats=False``), as vLLM's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from octavo.engine.stats import EngineStats

logger = logging.getLogger(__name__)

LOG_INTERVAL_SECONDS = 10.0  # vLLM's VLLM_LOG_STATS_INTERVAL default


@dataclass
class StatsLog:
    """Writes a line at most every ``interval`` seconds, from the engine's counters."""

    device: str  # "GPU" or "CPU": whose KV cache the line reports
    interval: float = LOG_INTERVAL_SECONDS
    last_time: float = field(default_factory=time.monotonic)
    last: EngineStats | None = None  # the counters at the previous line
    last_rates: tuple[float, float] = (0.0, 0.0)  # its prompt and generation throughputs

    def maybe_log(self, read_stats: Callable[[], EngineStats]) -> None:
        """The line, when one is due (``read_stats`` is called only then)."""
        now = time.monotonic()
        if now - self.last_time < self.interval:
            return
        stats = read_stats()
        text, args, rates = self.line(stats, now - self.last_time)
        idle = not any((*rates, *self.last_rates))
        (logger.debug if idle else logger.info)(text, *args)
        self.last, self.last_time, self.last_rates = stats, now, rates

    def line(
        self, stats: EngineStats, seconds: float
    ) -> tuple[str, list[float | int | str], tuple[float, float]]:
        """The line's format, its values and the interval's two throughputs."""
        since = self._since(stats)
        rates = (since["prompt_tokens"] / seconds, since["generation_tokens"] / seconds)
        parts = [
            "Engine 000: Avg prompt throughput: %.1f tokens/s",
            "Avg generation throughput: %.1f tokens/s",
            "Running: %d reqs",
            "Waiting: %d reqs",
        ]
        args: list[float | int | str] = [*rates, stats.num_running, stats.num_waiting]
        if since["num_preemptions"]:
            parts.append("Preemptions: %d")
            args.append(since["num_preemptions"])
        parts.append("%s KV cache usage: %.1f%%")
        args += [self.device, 100 * stats.kv_cache_usage]
        if since["prefix_cache_queries"]:
            parts.append("Prefix cache hit rate: %.1f%%")
            args.append(100 * since["prefix_cache_hits"] / since["prefix_cache_queries"])
        return ", ".join(parts), args, rates

    def _since(self, stats: EngineStats) -> dict[str, int]:
        """The counters' growth since the previous line (since the start for the first)."""
        names = (
            "prompt_tokens",
            "generation_tokens",
            "num_preemptions",
            "prefix_cache_queries",
            "prefix_cache_hits",
        )
        last = self.last
        return {name: getattr(stats, name) - (getattr(last, name) if last else 0) for name in names}
