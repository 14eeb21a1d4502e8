"""While a scale-to-zero InferenceService has no ready pod, an extra EndpointSlice for its
Service points at the operator's activator: kube-proxy merges every slice labelled with the
Service's name, so requests to the Service's usual address reach the activator, which
starts a pod and forwards them. The EndpointSlice controller leaves slices with another
``managed-by`` alone; the slice is deleted once a pod is ready."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from octavo_operator import constants as c
from octavo_operator.api.service import InferenceService

from .metadata import metadata

SLICE_MANAGED_BY = "activator.octavo.dev"


@dataclass(frozen=True)
class ActivatorAddress:
    ip: str
    port: int


def activator_slice_name(isvc: InferenceService) -> str:
    return f"{isvc.name}-activator"


def activator_slice(isvc: InferenceService, activator: ActivatorAddress) -> dict[str, Any]:
    meta = metadata(isvc, activator_slice_name(isvc), component="activator")
    meta["labels"].update(
        {
            "kubernetes.io/service-name": isvc.name,
            "endpointslice.kubernetes.io/managed-by": SLICE_MANAGED_BY,
        }
    )
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": meta,
        "addressType": "IPv6" if ":" in activator.ip else "IPv4",
        "endpoints": [{"addresses": [activator.ip], "conditions": {"ready": True}}],
        # Named like the Service's port: kube-proxy matches ports by name.
        "ports": [{"name": c.SERVER_PORT_NAME, "port": activator.port, "protocol": "TCP"}],
    }
