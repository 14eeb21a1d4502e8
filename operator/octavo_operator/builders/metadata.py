"""Names, labels and the owner reference shared by every child object."""

from __future__ import annotations

from typing import Any

from octavo_operator import constants as c
from octavo_operator.api.service import InferenceService


def selector_labels(isvc: InferenceService) -> dict[str, str]:
    """The labels that select this InferenceService's pods (never change: immutable selector)."""
    return {c.NAME_LABEL: c.APP_NAME, c.INSTANCE_LABEL: isvc.name}


def serving_labels(isvc: InferenceService) -> dict[str, str]:
    """The labels of the pods that serve the API: every pod, or with engine.nodes > 1 the
    groups' leaders only (the headless workers carry the worker component). The Service,
    the InferencePool and the /scale selector (what an HPA averages over) use them."""
    if not isvc.engine.multi_node:
        return selector_labels(isvc)
    return {**selector_labels(isvc), c.COMPONENT_LABEL: "server"}


def selector_string(isvc: InferenceService) -> str:
    """The /scale selector (status.selector): the pods that serve the API."""
    return ",".join(f"{k}={v}" for k, v in serving_labels(isvc).items())


def labels(isvc: InferenceService, component: str = "server") -> dict[str, str]:
    return {**selector_labels(isvc), c.COMPONENT_LABEL: component, c.MANAGED_BY_LABEL: c.MANAGED_BY}


def owner_reference(isvc: InferenceService) -> dict[str, Any]:
    """Garbage collection deletes the child with the InferenceService."""
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.KIND,
        "name": isvc.name,
        "uid": isvc.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def metadata(isvc: InferenceService, name: str, component: str = "server") -> dict[str, Any]:
    return {
        "name": name,
        "namespace": isvc.namespace,
        "labels": labels(isvc, component),
        "ownerReferences": [owner_reference(isvc)],
    }


def cache_claim_name(isvc: InferenceService) -> str:
    return f"{isvc.name}-cache"
