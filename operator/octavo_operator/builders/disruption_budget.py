"""The PodDisruptionBudgets that limit voluntary evictions (node drains).

With spec.prefill the service's budget counts the decode pods only: they serve the API, and
a prefill pod evicted in their place would not answer a request. The prefill pool gets its
own budget, `<name>-prefill`, with maxUnavailable 1 whatever spec.disruptionBudget says:
that budget is written in decode replicas (a minAvailable of 2 would block every drain of a
one-replica prefill pool forever), and a prefill pod down only means the decode pods compute
some prompts themselves, so one at a time is enough to keep the pool from emptying at once.
"""

from __future__ import annotations

from typing import Any

from octavo_operator import constants as c
from octavo_operator.api.service import InferenceService

from .metadata import metadata, selector_labels


def in_pods(isvc: InferenceService, count: int | str) -> int | str:
    """A budget in replicas, counted in pods. With engine.nodes > 1 the budget covers every
    pod of every group, leaders and workers: evicting any pod recreates its whole group,
    so a replica down is engine.nodes pods down. Percentages need no conversion."""
    return count * isvc.engine.nodes if isinstance(count, int) else count


def role_selector(isvc: InferenceService, role: str | None) -> dict[str, Any]:
    """The pods of one pool: every server pod, or with spec.prefill those of ROLE."""
    labels = selector_labels(isvc)
    return {"matchLabels": labels if role is None else {**labels, c.ROLE_LABEL: role}}


def budget_object(
    isvc: InferenceService, name: str, spec: dict[str, Any], component: str = "server"
) -> dict[str, Any]:
    # Pods that never became ready may always be evicted: a stuck rollout can be drained.
    spec["unhealthyPodEvictionPolicy"] = "AlwaysAllow"
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(isvc, name, component),
        "spec": spec,
    }


def pod_disruption_budget(isvc: InferenceService) -> dict[str, Any]:
    """spec.disruptionBudget over the pods that serve the API (the decode pool's with
    spec.prefill: isvc.role is decode there)."""
    budget = isvc.disruption_budget
    assert budget is not None
    spec: dict[str, Any] = {"selector": role_selector(isvc, isvc.role)}
    if budget.max_unavailable is not None:
        spec["maxUnavailable"] = in_pods(isvc, budget.max_unavailable)
    else:
        spec["minAvailable"] = in_pods(isvc, budget.min_available)
    return budget_object(isvc, isvc.name, spec)


def prefill_disruption_budget(isvc: InferenceService) -> dict[str, Any]:
    """The prefill pool's budget: one pod at a time (see the module's docstring)."""
    spec: dict[str, Any] = {"selector": role_selector(isvc, c.PREFILL_ROLE), "maxUnavailable": 1}
    return budget_object(isvc, isvc.prefill_name, spec, c.PREFILL_COMPONENT)
