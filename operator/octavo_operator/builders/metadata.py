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
    """The /scale selector (status.selector): the pods that serve the API; with spec.prefill
    the decode pods (what spec.replicas and an HPA count)."""
    wanted = serving_labels(isvc)
    if isvc.role is not None:
        wanted = {**wanted, c.ROLE_LABEL: c.DECODE_ROLE}
    return ",".join(f"{k}={v}" for k, v in wanted.items())


def labels(isvc: InferenceService, component: str | None = None) -> dict[str, str]:
    """Every child's labels; COMPONENT defaults to the server pods' (the prefill pool's in
    its copy, builders/prefill.py)."""
    if component is None:
        component = c.PREFILL_COMPONENT if isvc.prefill_view else "server"
    return {**selector_labels(isvc), c.COMPONENT_LABEL: component, c.MANAGED_BY_LABEL: c.MANAGED_BY}


def pool_selector(isvc: InferenceService) -> dict[str, str]:
    """The Deployment's selector (immutable): the server pods' as ever, and the prefill
    pool's apart by its component (the decode Deployment's own selector also matches the
    prefill pods, but it only counts the ReplicaSets it owns)."""
    if isvc.prefill_view:
        return {**selector_labels(isvc), c.COMPONENT_LABEL: c.PREFILL_COMPONENT}
    return selector_labels(isvc)


def pool_labels(isvc: InferenceService) -> dict[str, str]:
    """A server pod's labels: with spec.prefill also its llm-d.ai/role (the picker's
    prefill-filter and decode-filter)."""
    out = labels(isvc)
    if isvc.role is not None:
        out[c.ROLE_LABEL] = isvc.role
    return out


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
    """Every child's metadata; COMPONENT as labels() takes it (the server's by default)."""
    return {
        "name": name,
        "namespace": isvc.namespace,
        "labels": labels(isvc, component),
        "ownerReferences": [owner_reference(isvc)],
    }


def cache_claim_name(isvc: InferenceService) -> str:
    return f"{isvc.name}-cache"
