"""The endpoint picker's EndpointPickerConfig (a ConfigMap mounted at /config).

Plugin types and parameters are the llm-d router v0.10.0's (deploy/config/
epp-precise-prefix-cache-config.yaml and the plugins' READMEs): a `token-producer` with the
`vllm` backend asks the tokenizer sidecar for token ids; the `precise-prefix-cache-producer`
indexes the pods' KV events (pod discovery through the `endpoint-notification-source`) and
feeds the `prefix-cache-scorer`; queue, KV-cache and LoRA scorers read the pods' metrics
(`metrics-data-source` + `core-metrics-extractor`); the `max-score-picker` picks.
A scorer whose weight is 0 is left out.

With spec.prefill the picker disaggregates (deploy/config/pd-epp-config.yaml, KServe's
default with spec.prefill): the `disagg-profile-handler` runs the `decode` profile (the
`decode-filter`: pods labelled llm-d.ai/role decode), asks its prefill decider (the
`always-disagg-pd-decider`: every request) and runs the `prefill` profile (the
`prefill-filter`), then sets the `x-prefiller-host-port` header the decode pod's routing
sidecar reads. In v0.10.0 the handler writes that header itself: the deprecated
`disagg-headers-handler` is left out. Both profiles use the scorers of spec.router.
"""

from __future__ import annotations

from typing import Any

import yaml

from octavo_operator import constants as c
from octavo_operator.api.service import InferenceService

from .kv_events import TOPIC_PREFIX
from .picker import CONFIG_FILE, picker_metadata

CONFIG_API_VERSION = "llm-d.ai/v1alpha1"  # v0.10.0's; inference.networking.x-k8s.io is deprecated
PRECISE_PRODUCER = "precise-prefix-cache-producer"
PREFIX_SCORER = "prefix-cache-scorer"
NOTIFICATIONS = "endpoint-notification-source"
METRICS_SOURCE = "metrics-data-source"
METRICS_EXTRACTOR = "core-metrics-extractor"
PICKER = "max-score-picker"
PROFILE_HANDLER = "single-profile-handler"
DISAGG_HANDLER = "disagg-profile-handler"
PD_DECIDER = "always-disagg-pd-decider"
ROLE_FILTERS = {"prefill": "prefill-filter", "decode": "decode-filter"}
# How long a request may wait in the picker for a service at zero: the activator's wait.
WAKE_TTL_SECONDS = 600


def prefix_plugins(isvc: InferenceService) -> list[dict[str, Any]]:
    router = isvc.router
    assert router is not None
    kv_events = {
        "topicFilter": TOPIC_PREFIX,
        "discoverPods": True,
        "podDiscoveryConfig": {
            "socketPort": router.kv_events_port,
            "replaySocketPort": router.replay_port,
        },
    }
    tokenizer = {
        "modelName": isvc.served_name,
        "vllm": {"url": f"http://localhost:{c.RENDER_PORT}"},
    }
    return [
        {"type": "token-producer", "parameters": tokenizer},
        {"type": NOTIFICATIONS},
        {
            "type": PRECISE_PRODUCER,
            "parameters": {
                "tokenProcessorConfig": {"blockSize": router.block_size or isvc.block_size},
                "kvEventsConfig": kv_events,
            },
        },
        {"type": PREFIX_SCORER, "parameters": {"prefixMatchInfoProducerName": PRECISE_PRODUCER}},
    ]


def weighted_scorers(isvc: InferenceService) -> list[tuple[str, float]]:
    s = isvc.router.scorers  # type: ignore[union-attr]
    weights = [
        (PREFIX_SCORER, s.precise_prefix_cache),
        ("queue-scorer", s.queue),
        ("kv-cache-utilization-scorer", s.kv_cache_utilization),
        ("lora-affinity-scorer", s.lora_affinity),
    ]
    return [(name, weight) for name, weight in weights if weight > 0]


def endpoint_picker_config(isvc: InferenceService) -> dict[str, Any]:
    scorers = weighted_scorers(isvc)
    precise = any(name == PREFIX_SCORER for name, _ in scorers)
    plugins = prefix_plugins(isvc) if precise else []
    plugins += [{"type": name} for name, _ in scorers if name != PREFIX_SCORER]
    plugins += [{"type": METRICS_SOURCE}, {"type": METRICS_EXTRACTOR}, {"type": PICKER}]
    plugins += profile_handler_plugins(isvc)
    sources = [{"pluginRef": METRICS_SOURCE, "extractors": [{"pluginRef": METRICS_EXTRACTOR}]}]
    if precise:
        sources.append(
            {"pluginRef": NOTIFICATIONS, "extractors": [{"pluginRef": PRECISE_PRODUCER}]}
        )
    config: dict[str, Any] = {
        "apiVersion": CONFIG_API_VERSION,
        "kind": "EndpointPickerConfig",
        "plugins": plugins,
        "dataLayer": {"sources": sources},
        "schedulingProfiles": scheduling_profiles(isvc, scorers),
    }
    if isvc.scales_to_zero:
        config.update(scale_from_zero())
    return config


def profile_handler_plugins(isvc: InferenceService) -> list[dict[str, Any]]:
    if not isvc.disaggregated:
        return [{"type": PROFILE_HANDLER}]
    return [
        *({"type": kind} for kind in ROLE_FILTERS.values()),
        {"type": PD_DECIDER},
        {"type": DISAGG_HANDLER, "parameters": {"deciders": {"prefill": PD_DECIDER}}},
    ]


def scheduling_profiles(
    isvc: InferenceService, scorers: list[tuple[str, float]]
) -> list[dict[str, Any]]:
    """One `default` profile; with spec.prefill a `prefill` and a `decode` profile, each
    behind its role filter."""
    weighted = [{"pluginRef": name, "weight": weight} for name, weight in scorers]
    if not isvc.disaggregated:
        return [{"name": "default", "plugins": [*weighted, {"pluginRef": PICKER}]}]
    return [
        {"name": role, "plugins": [{"pluginRef": kind}, *weighted, {"pluginRef": PICKER}]}
        for role, kind in ROLE_FILTERS.items()
    ]


def scale_from_zero() -> dict[str, Any]:
    """Flow control: with no pod in the pool its queue holds the requests (up to the TTL)
    while the operator wakes the service on the queue's size (picker_wakeup.py)."""
    return {
        "featureGates": ["flowControl"],
        "flowControl": {"defaultRequestTTL": f"{WAKE_TTL_SECONDS}s"},
    }


def picker_config_map(isvc: InferenceService) -> dict[str, Any]:
    text = yaml.safe_dump(endpoint_picker_config(isvc), sort_keys=False)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": picker_metadata(isvc),
        "data": {CONFIG_FILE: text},
    }
