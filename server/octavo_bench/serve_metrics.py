"""Per-request records of ``python -m octavo_bench serve`` and the figures of one concurrency level.

Definitions (as ``vllm bench serve`` reports them):
  TTFT  time from sending the request to its first streamed chunk with content
  TPOT  (latency - TTFT) / (output tokens - 1), per request with more than one token
  ITL   gaps between consecutive content chunks, pooled over all requests
  E2EL  the client's latency from send to the end of the stream
Throughputs divide totals over successful requests by the level's wall time.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field


@dataclass
class RequestRecord:
    """What the client saw of one request; times in seconds."""

    success: bool = False
    prompt_len: int = 0  # from the server's usage, else the prompt's word count
    output_len: int = 0  # from the server's usage, else the number of content chunks
    ttft: float = 0.0
    latency: float = 0.0
    itls: list[float] = field(default_factory=list)
    start: float = 0.0  # send time, seconds after the level began
    usage_reported: bool = False
    error: str = ""

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first; None with one token or fewer."""
        if not self.success or self.output_len <= 1:
            return None
        return (self.latency - self.ttft) / (self.output_len - 1)

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Summary:
    """Mean, median and p99 of a list of durations, in milliseconds (None when empty)."""

    mean_ms: float | None
    median_ms: float | None
    p99_ms: float | None


@dataclass
class LevelMetrics:
    """The figures of one concurrency level, as ``vllm bench serve`` prints them."""

    completed: int
    failed: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    ttft: Summary
    tpot: Summary
    itl: Summary
    e2el: Summary


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation between closest ranks."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(seconds: Sequence[float]) -> Summary:
    """Mean, median and p99 of durations given in seconds, reported in milliseconds."""
    if not seconds:
        return Summary(None, None, None)
    return Summary(
        mean_ms=statistics.fmean(seconds) * 1000.0,
        median_ms=statistics.median(seconds) * 1000.0,
        p99_ms=percentile(seconds, 99.0) * 1000.0,
    )


def level_metrics(records: Sequence[RequestRecord], duration_s: float) -> LevelMetrics:
    """Aggregate a level's records; ``duration_s`` is its wall time (first send to last end)."""
    done = [record for record in records if record.success]
    input_tokens = sum(record.prompt_len for record in done)
    output_tokens = sum(record.output_len for record in done)
    per_second = 1.0 / duration_s if duration_s > 0 else 0.0
    tpots = [tpot for record in done if (tpot := record.tpot) is not None]
    return LevelMetrics(
        completed=len(done),
        failed=len(records) - len(done),
        duration_s=duration_s,
        total_input_tokens=input_tokens,
        total_output_tokens=output_tokens,
        request_throughput=len(done) * per_second,
        output_throughput=output_tokens * per_second,
        total_token_throughput=(input_tokens + output_tokens) * per_second,
        ttft=summarize([record.ttft for record in done]),
        tpot=summarize(tpots),
        itl=summarize([gap for record in done for gap in record.itls]),
        e2el=summarize([record.latency for record in done]),
    )
