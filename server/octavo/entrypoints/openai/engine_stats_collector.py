"""The engine's running totals as Prometheus metrics, read at scrape time.

The engine keeps cumulative counts (prompt tokens, preemptions, prefix-cache lookups)
and current levels (requests running, KV cache usage) in ``EngineStats``. The engine
thread hands each step's stats to ``update``; a scrape reports the newest of them as
they are, so no increments are computed here. prometheus_client appends ``_total`` to
counters: ``vllm:prompt_tokens`` is scraped as ``vllm:prompt_tokens_total``.

Once the engine has loaded (``engine_info`` answers), the info gauges of
``info_metrics.py`` follow: the KV cache's configuration, and with LoRA on the adapters
of the running and waiting requests.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from octavo.engine.engine_info import EngineInfo
from octavo.engine.stats import EngineStats
from octavo.entrypoints.openai.info_metrics import cache_config_info, lora_requests_info
from octavo.entrypoints.openai.kv_offload_metrics import offload_metrics
from octavo.entrypoints.openai.kv_transfer_metrics import transfer_metrics
from octavo.scheduler.spec_decode_counters import SpecDecodeCounters

# Metric name -> (the EngineStats field holding its current value, help text).
ENGINE_GAUGES = {
    "vllm:num_requests_running": ("num_running", "Requests running."),
    "vllm:num_requests_waiting": ("num_waiting", "Requests waiting."),
    "vllm:kv_cache_usage_perc": ("kv_cache_usage", "KV cache usage (1 = full)."),
}
# Counter name (without _total) -> the EngineStats field holding its cumulative value.
ENGINE_COUNTERS = {
    "vllm:prompt_tokens": "prompt_tokens",
    "vllm:generation_tokens": "generation_tokens",
    "vllm:prefix_cache_queries": "prefix_cache_queries",
    "vllm:prefix_cache_hits": "prefix_cache_hits",
    "vllm:num_preemptions": "num_preemptions",
}
LABEL_NAMES = ["model_name"]
# With speculative decoding on: counter name -> the SpecDecodeCounters field.
SPEC_DECODE_COUNTERS = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
}
SPEC_DECODE_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


class EngineStatsCollector(Collector):
    """Reports the newest ``EngineStats`` of one engine; zeros until the first step."""

    def __init__(
        self, model_name: str, engine_info: Callable[[], EngineInfo | None] = lambda: None
    ) -> None:
        self.model_name = model_name
        self.engine_info = engine_info  # the loaded engine's facts (None while loading)
        self._created = time.time()  # the counters count from the engine's start
        self._latest: EngineStats | None = None
        self._latest_time = self._created
        self._left_out: dict[str, float] = {}  # counter field -> the server's own share

    def leave_out(self, **counts: float) -> None:
        """Keep the server's own requests (the structured-output warm-up) out of the token
        and prefix-cache counters, e.g. ``generation_tokens=1`` (on the engine thread)."""
        for field, count in counts.items():
            self._left_out[field] = self._left_out.get(field, 0.0) + count

    def update(self, stats: EngineStats) -> None:
        """Keep ``stats`` for the next scrape (called on the engine thread)."""
        self._latest = stats  # one reference swap: a scrape sees the old or the new whole
        self._latest_time = time.time()

    def collect(self) -> Iterator[Metric]:
        stats, labels = self._latest, [self.model_name]
        for name, (field, help_text) in ENGINE_GAUGES.items():
            gauge = GaugeMetricFamily(name, help_text, labels=LABEL_NAMES)
            gauge.add_metric(labels, _value(stats, field))
            yield gauge
        for name, field in ENGINE_COUNTERS.items():
            help_text = f"Cumulative {field.replace('_', ' ')}."
            counter = CounterMetricFamily(name, help_text, labels=LABEL_NAMES)
            value = _value(stats, field) - self._left_out.get(field, 0.0)
            counter.add_metric(labels, max(value, 0.0), created=self._created)
            yield counter
        if stats is not None and stats.spec_decode is not None:
            yield from self._spec_decode(stats.spec_decode)
        if stats is not None and stats.kv_offload is not None:
            yield from offload_metrics(stats.kv_offload, self.model_name, self._created)
        if stats is not None and stats.kv_transfer is not None:
            yield from transfer_metrics(stats, self.model_name, self._created)
        yield from self._info_gauges(stats)

    def _info_gauges(self, stats: EngineStats | None) -> Iterator[Metric]:
        info = self.engine_info()
        if info is None:
            return
        if info.kv_cache is not None:
            yield cache_config_info(info.kv_cache)
        if info.enable_lora:  # as vLLM: only with LoRA on
            yield lora_requests_info(info, stats, self._latest_time)

    def _spec_decode(self, counters: SpecDecodeCounters) -> Iterator[Metric]:
        labels = [self.model_name]
        for name, field in SPEC_DECODE_COUNTERS.items():
            help_text = f"Speculative decoding: cumulative {field.replace('_', ' ')}."
            counter = CounterMetricFamily(name, help_text, labels=LABEL_NAMES)
            counter.add_metric(labels, getattr(counters, field), created=self._created)
            yield counter
        per_position = CounterMetricFamily(
            SPEC_DECODE_PER_POSITION,
            "Speculative decoding: accepted proposals, by position in the proposal.",
            labels=[*LABEL_NAMES, "position"],
        )
        for position, count in enumerate(counters.accepted_per_position):
            per_position.add_metric([*labels, str(position)], count, created=self._created)
        yield per_position


def _value(stats: EngineStats | None, field: str) -> float:
    return 0.0 if stats is None else float(getattr(stats, field))
