"""P/D disaggregation's Prometheus metrics (``--kv-transfer-config``), vLLM-style names.

- ``vllm:prompt_tokens_by_source`` (vLLM's counter, label ``source``): prompt tokens
  computed here (``local_compute``), found in the prefix cache (``local_cache_hit``) and
  received from a remote prefill (``external_kv_transfer``). ``local_compute`` is what the
  other two leave of ``vllm:prompt_tokens`` (a prompt recomputed after a preemption counts
  its cache hits again, so it is a floor).
- ``vllm:kv_transfer_received_bytes``, ``vllm:kv_transfer_seconds`` (summed over
  transfers: metadata check, read and free), ``vllm:kv_transfer_requests`` by ``outcome``
  (``ok``/``failed``): the decode side's pulls.
- ``vllm:kv_transfer_leases_held`` (gauge), ``vllm:kv_transfer_leases`` by ``outcome``
  (``read``: freed by the decode engine, ``expired``): the prefill side's held blocks.

Only with a KV connector: nothing is exported without one.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from octavo.engine.stats import EngineStats

LABEL_NAMES = ["model_name"]


def transfer_metrics(stats: EngineStats, model_name: str, created: float) -> Iterator[Metric]:
    assert stats.kv_transfer is not None
    decode, prefill = stats.kv_transfer.decode, stats.kv_transfer.prefill
    labels = [model_name]
    external = decode.prompt_tokens_received
    local = max(0, stats.prompt_tokens - stats.prefix_cache_hits - external)
    yield _by_label(
        "vllm:prompt_tokens_by_source",
        "Prompt tokens by where their KV came from.",
        "source",
        {
            "local_compute": local,
            "local_cache_hit": stats.prefix_cache_hits,
            "external_kv_transfer": external,
        },
        labels,
        created,
    )
    for name, value, help_text in [
        ("vllm:kv_transfer_received_bytes", decode.bytes_received, "KV bytes pulled."),
        ("vllm:kv_transfer_seconds", decode.transfer_seconds, "Seconds spent pulling KV."),
    ]:
        counter = CounterMetricFamily(name, help_text, labels=LABEL_NAMES)
        counter.add_metric(labels, value, created=created)
        yield counter
    outcomes = {"ok": decode.transfers, "failed": decode.failures}
    yield _by_label(
        "vllm:kv_transfer_requests", "KV pulls by outcome.", "outcome", outcomes, labels, created
    )
    held = GaugeMetricFamily(
        "vllm:kv_transfer_leases_held",
        "Prompts whose blocks wait for a decode.",
        labels=LABEL_NAMES,
    )
    held.add_metric(labels, stats.kv_transfer.leases_held)
    yield held
    ended = {"read": prefill.freed_by_reader, "expired": prefill.expired}
    yield _by_label(
        "vllm:kv_transfer_leases", "Leases ended, by outcome.", "outcome", ended, labels, created
    )


def _by_label(
    name: str,
    help_text: str,
    label: str,
    values: dict[str, float],
    labels: list[str],
    created: float,
) -> CounterMetricFamily:
    counter = CounterMetricFamily(name, help_text, labels=[*LABEL_NAMES, label])
    for value_label, value in values.items():
        counter.add_metric([*labels, value_label], value, created=created)
    return counter
