"""The Service in front of the server pods (its DNS name is the InferenceService's url)."""

from __future__ import annotations

from typing import Any

from octavo_operator import constants as c
from octavo_operator.api.service import InferenceService

from .metadata import metadata, serving_labels


def service(isvc: InferenceService) -> dict[str, Any]:
    """With spec.prefill the decode pods only (their routing sidecar serves a request alone
    when no prefill pod is named); the prefill pods answer the sidecars."""
    selector = serving_labels(isvc)
    if isvc.role is not None:
        selector = {**selector, c.ROLE_LABEL: c.DECODE_ROLE}
    port = {
        "name": c.SERVER_PORT_NAME,
        "port": c.SERVER_PORT,
        "targetPort": c.SERVER_PORT_NAME,
        "protocol": "TCP",
        "appProtocol": "http",
    }
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(isvc, isvc.name),
        "spec": {"type": "ClusterIP", "selector": selector, "ports": [port]},
    }
