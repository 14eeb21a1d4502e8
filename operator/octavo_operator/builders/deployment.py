"""The Deployment that runs the server pods."""

from __future__ import annotations

from typing import Any

from octavo_operator import constants as c
from octavo_operator.api.service import InferenceService

from .container import server_container
from .metadata import labels, metadata, pool_labels, pool_selector
from .routing_sidecar import add_routing_sidecar
from .volumes import volumes

POD_UID = 10001  # the image's non-root user


def pod_security_context() -> dict[str, Any]:
    """Every pod the operator makes runs as the image's non-root user."""
    return {
        "runAsNonRoot": True,
        "runAsUser": POD_UID,
        "runAsGroup": POD_UID,
        "fsGroup": POD_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def strategy(isvc: InferenceService) -> dict[str, Any]:
    if isvc.rollout.strategy == "Recreate":
        return {"type": "Recreate"}
    rolling = {"maxSurge": isvc.rollout.max_surge, "maxUnavailable": isvc.rollout.max_unavailable}
    return {"type": "RollingUpdate", "rollingUpdate": rolling}


def pod_annotations() -> dict[str, str]:
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(c.SERVER_PORT),
        "prometheus.io/path": "/metrics",
    }


def pod_spec(
    isvc: InferenceService, image: str, sidecar_image: str = c.DEFAULT_SIDECAR_IMAGE
) -> dict[str, Any]:
    spec = pod_spec_with(isvc, server_container(isvc, image))
    if isvc.role == c.DECODE_ROLE:  # spec.prefill: the routing sidecar in front
        add_routing_sidecar(spec, isvc, sidecar_image)
    return spec


def pod_spec_with(isvc: InferenceService, container: dict[str, Any]) -> dict[str, Any]:
    """A server pod around CONTAINER: volumes, drain, security, scheduling."""
    s = isvc.scheduling
    spec: dict[str, Any] = {
        "containers": [container],
        "volumes": volumes(isvc),
        "terminationGracePeriodSeconds": isvc.drain.termination_grace_period_seconds,
        "securityContext": pod_security_context(),
        "enableServiceLinks": False,
        # The server never calls the Kubernetes API: no token for a compromised pod to use.
        "automountServiceAccountToken": False,
    }
    optional = {
        "nodeSelector": s.node_selector or None,
        "tolerations": s.tolerations or None,
        "affinity": s.affinity,
        "priorityClassName": s.priority_class_name,
        "runtimeClassName": s.runtime_class_name,
    }
    spec.update({k: v for k, v in optional.items() if v is not None})
    return spec


def deployment(
    isvc: InferenceService, image: str, sidecar_image: str = c.DEFAULT_SIDECAR_IMAGE
) -> dict[str, Any]:
    """The server pods' Deployment, or of the prefill pool's copy (builders/prefill.py)."""
    template = {
        "metadata": {"labels": pool_labels(isvc), "annotations": pod_annotations()},
        "spec": pod_spec(isvc, image, sidecar_image),
    }
    name = isvc.prefill_name if isvc.prefill_view else isvc.name
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(isvc, name, component=labels(isvc)[c.COMPONENT_LABEL]),
        "spec": {
            "replicas": isvc.desired_replicas,
            "selector": {"matchLabels": pool_selector(isvc)},
            "strategy": strategy(isvc),
            # A model that takes the whole startup budget is still progressing.
            "progressDeadlineSeconds": isvc.startup_timeout_seconds + 600,
            "revisionHistoryLimit": 5,
            "template": template,
        },
    }
