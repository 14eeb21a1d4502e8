"""The PodDisruptionBudget that limits voluntary evictions (node drains)."""

from __future__ import annotations

from typing import Any

from octavo_operator.api.service import InferenceService

from .metadata import metadata, selector_labels


def pod_disruption_budget(isvc: InferenceService) -> dict[str, Any]:
    budget = isvc.disruption_budget
    assert budget is not None
    spec: dict[str, Any] = {"selector": {"matchLabels": selector_labels(isvc)}}
    if budget.max_unavailable is not None:
        spec["maxUnavailable"] = budget.max_unavailable
    else:
        spec["minAvailable"] = budget.min_available
    # Pods that never became ready may always be evicted: a stuck rollout can be drained.
    spec["unhealthyPodEvictionPolicy"] = "AlwaysAllow"
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(isvc, isvc.name),
        "spec": spec,
    }
