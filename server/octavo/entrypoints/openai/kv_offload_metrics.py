"""The KV offload tier's Prometheus metrics (``--kv-offloading-size``), vLLM's names.

vLLM's offloading connector exports ``vllm:kv_offload_total_bytes`` by
``transfer_type`` (``GPU_to_CPU`` for saves, ``CPU_to_GPU`` for loads: vLLM's names for
the engine's cache and its host tier, whatever the device) and counts the tier's hits
in ``vllm:external_prefix_cache_queries`` / ``_hits`` (prompt tokens). Octavo adds the
block counts ``vllm:kv_offload_stored_blocks`` and ``vllm:kv_offload_loaded_blocks``.
``vllm:prefix_cache_hits`` still counts every prompt token not recomputed, those loaded
from the tier included. Only with a tier: nothing is exported without one.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric

from octavo.kv_cache.offload_tier import OffloadCounters

LABEL_NAMES = ["model_name"]
# Counter name (without _total) -> (the OffloadCounters field, help text).
OFFLOAD_COUNTERS = {
    "vllm:external_prefix_cache_queries": ("queries", "Prompt tokens looked up in the tier."),
    "vllm:external_prefix_cache_hits": ("hits", "Prompt tokens loaded from the tier."),
    "vllm:kv_offload_stored_blocks": ("stored_blocks", "KV blocks saved to the tier."),
    "vllm:kv_offload_loaded_blocks": ("loaded_blocks", "KV blocks loaded from the tier."),
}


def offload_metrics(counters: OffloadCounters, model_name: str, created: float) -> Iterator[Metric]:
    labels = [model_name]
    for name, (field, help_text) in OFFLOAD_COUNTERS.items():
        counter = CounterMetricFamily(name, help_text, labels=LABEL_NAMES)
        counter.add_metric(labels, getattr(counters, field), created=created)
        yield counter
    total = CounterMetricFamily(
        "vllm:kv_offload_total_bytes",
        "Bytes copied between the KV cache and the offload tier.",
        labels=[*LABEL_NAMES, "transfer_type"],
    )
    size = counters.bytes_per_block
    total.add_metric([*labels, "GPU_to_CPU"], counters.stored_blocks * size, created=created)
    total.add_metric([*labels, "CPU_to_GPU"], counters.loaded_blocks * size, created=created)
    yield total
