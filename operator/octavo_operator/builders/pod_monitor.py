"""A Prometheus Operator PodMonitor for the prefill pool's /metrics (spec.prefill).

The ServiceMonitor scrapes through the service's Service, whose endpoints are the decode
pods only (a prefill pod must not answer API requests), so the prefill pods' prompt
throughput, TTFT and KV transfer leases are scraped here instead, straight from the pods
labelled llm-d.ai/role: prefill, on the same port, path and interval.
"""

from __future__ import annotations

from typing import Any

from octavo_operator import constants as c
from octavo_operator.api.service import InferenceService

from .metadata import metadata, selector_labels
from .service_monitor import API_VERSION


def prefill_pod_monitor(isvc: InferenceService) -> dict[str, Any]:
    endpoint = {
        "port": c.SERVER_PORT_NAME,  # a prefill pod's engine serves on it directly
        "path": "/metrics",
        "interval": isvc.monitoring.interval,
        "scheme": "http",
    }
    pods = {**selector_labels(isvc), c.ROLE_LABEL: c.PREFILL_ROLE}
    return {
        "apiVersion": API_VERSION,
        "kind": "PodMonitor",
        "metadata": metadata(isvc, isvc.prefill_name, c.PREFILL_COMPONENT),
        "spec": {
            "selector": {"matchLabels": pods},
            "namespaceSelector": {"matchNames": [isvc.namespace]},
            "podMetricsEndpoints": [endpoint],
        },
    }
