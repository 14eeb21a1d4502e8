"""vLLM's two info gauges, which endpoint pickers read: ``vllm:cache_config_info`` and
``vllm:lora_requests_info``.

Both carry their facts in labels. The model-server protocol of the Gateway API Inference
Extension (and the llm-d router that implements it) reads ``block_size`` and
``num_gpu_blocks`` from the first, as integers; from the second ``max_lora`` (an
integer) and the comma-separated adapter names of ``running_lora_adapters`` and
``waiting_lora_adapters`` (an empty string when there are none), taking the series whose
value — the time its labels were last true, in seconds since the epoch — is newest.
"""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily, Metric

from octavo.engine.engine_info import EngineInfo, KVCacheFacts
from octavo.engine.stats import EngineStats

CACHE_CONFIG_INFO = "vllm:cache_config_info"
LORA_REQUESTS_INFO = "vllm:lora_requests_info"
# vLLM's label order; the values are vLLM's too (its CacheConfig fields, as str()).
LORA_INFO_LABELS = ["max_lora", "waiting_lora_adapters", "running_lora_adapters"]
ENGINE_INDEX = "0"  # vLLM's ``engine`` label: this server runs one engine core


def cache_config_info(cache: KVCacheFacts) -> Metric:
    """An info gauge (value 1) whose labels are the KV cache's configuration."""
    labels = {
        "block_size": str(cache.block_size),
        "cache_dtype": cache.cache_dtype,
        "enable_prefix_caching": str(cache.enable_prefix_caching),
        "gpu_memory_utilization": str(cache.gpu_memory_utilization),
        "kv_cache_memory_bytes": str(cache.kv_cache_memory_bytes),
        "num_cpu_blocks": str(None),  # no CPU swap space: vLLM reports None too
        "num_gpu_blocks": str(cache.num_gpu_blocks),
        "engine": ENGINE_INDEX,
    }
    gauge = GaugeMetricFamily(
        CACHE_CONFIG_INFO, "Information of the LLMEngine CacheConfig", labels=list(labels)
    )
    gauge.add_metric(list(labels.values()), 1.0)
    return gauge


def lora_requests_info(info: EngineInfo, stats: EngineStats | None, updated: float) -> Metric:
    """The adapters of the running and the waiting requests as of ``updated`` (the time of
    the engine step ``stats`` come from; none yet: nothing runs or waits)."""
    running = ",".join(stats.running_loras) if stats is not None else ""
    waiting = ",".join(stats.waiting_loras) if stats is not None else ""
    gauge = GaugeMetricFamily(
        LORA_REQUESTS_INFO, "Running stats on lora requests.", labels=LORA_INFO_LABELS
    )
    gauge.add_metric([str(info.max_loras), waiting, running], updated)
    return gauge
