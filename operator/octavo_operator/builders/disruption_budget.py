"""The PodDisruptionBudget that limits voluntary evictions (node drains)."""

from __future__ import annotations

from typing import Any

from octavo_operator.api.service import InferenceService

from .metadata import metadata, selector_labels


def in_pods(isvc: InferenceService, count: int | str) -> int | str:
    """A budget in replicas, counted in pods. With engine.nodes > 1 the budget covers every
    pod of every group, leaders and workers: evicting any pod recreates its whole group,
    so a replica down is engine.nodes pods down. Percentages need no conversion."""
    return count * isvc.engine.nodes if isinstance(count, int) else count


def pod_disruption_budget(isvc: InferenceService) -> dict[str, Any]:
    budget = isvc.disruption_budget
    assert budget is not None
    spec: dict[str, Any] = {"selector": {"matchLabels": selector_labels(isvc)}}
    if budget.max_unavailable is not None:
        spec["maxUnavailable"] = in_pods(isvc, budget.max_unavailable)
    else:
        spec["minAvailable"] = in_pods(isvc, budget.min_available)
    # Pods that never became ready may always be evicted: a stuck rollout can be drained.
    spec["unhealthyPodEvictionPolicy"] = "AlwaysAllow"
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(isvc, isvc.name),
        "spec": spec,
    }
