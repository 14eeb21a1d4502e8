"""A Prometheus Operator ServiceMonitor for the server's /metrics."""

from __future__ import annotations

from typing import Any

from octavo_operator import constants as c
from octavo_operator.api.service import InferenceService

from .metadata import metadata, selector_labels

API_VERSION = "monitoring.coreos.com/v1"


def service_monitor(isvc: InferenceService) -> dict[str, Any]:
    endpoint = {
        "port": c.SERVER_PORT_NAME,
        "path": "/metrics",
        "interval": isvc.monitoring.interval,
        "scheme": "http",
    }
    return {
        "apiVersion": API_VERSION,
        "kind": "ServiceMonitor",
        "metadata": metadata(isvc, isvc.name),
        "spec": {
            "selector": {"matchLabels": selector_labels(isvc)},
            "namespaceSelector": {"matchNames": [isvc.namespace]},
            "endpoints": [endpoint],
        },
    }
