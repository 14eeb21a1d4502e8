"""The status of an InferenceService, computed from what its children report.

Pure: the inputs are plain dicts as the API returns them, so every rule is unit-tested.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from octavo_operator import constants as c
from octavo_operator.adapter_sync import AdapterReport, adapters_condition
from octavo_operator.api.service import InferenceService
from octavo_operator.builders.metadata import selector_string
from octavo_operator.conditions import DEGRADED, PROGRESSING, READY, Condition
from octavo_operator.prefill_status import prefill_condition, prefill_fields, prefill_invalid
from octavo_operator.router_status import router_condition, router_fields

LWS_API_MISSING = "LeaderWorkerSetAPIMissing"
LWS_INSTALL = (
    "kubectl apply --server-side -f https://github.com/kubernetes-sigs/lws/releases/download/"
    "v0.9.0/manifests.yaml"
)


@dataclass(frozen=True)
class Observed:
    """What the operator saw: its own last apply, the workload (the Deployment, or the
    LeaderWorkerSet with engine.nodes > 1: the same fields, counted in groups), the pods
    (leaders and workers), missing claims."""

    applied_generation: int | None = None
    apply_error: str | None = None
    deployment: dict[str, Any] | None = None
    pods: list[dict[str, Any]] = field(default_factory=list)
    missing_claims: list[tuple[str, str]] = field(default_factory=list)  # (role, claim)
    adapters: AdapterReport | None = None  # the last adapter sync (with spec.adapters)
    pools_served: bool | None = None  # the InferencePool API, as the last apply found it
    picker: dict[str, Any] | None = None  # the endpoint picker's Deployment (spec.router)
    lws_served: bool | None = None  # engine.nodes > 1: the LeaderWorkerSet API, as last found
    prefill: dict[str, Any] | None = None  # the prefill pool's Deployment (spec.prefill)
    prefill_conflict: str | None = None  # spec.prefill's names belong to another owner


@dataclass(frozen=True)
class ReplicaCounts:
    desired: int
    replicas: int
    ready: int
    updated: int
    current: bool  # the Deployment controller saw the latest Deployment spec

    @property
    def rolled_out(self) -> bool:
        return self.current and self.updated >= self.desired and self.replicas == self.desired

    @property
    def all_ready(self) -> bool:
        return self.rolled_out and self.ready >= self.desired


def replica_counts(isvc: InferenceService, deployment: dict[str, Any] | None) -> ReplicaCounts:
    if deployment is None:
        return ReplicaCounts(isvc.desired_replicas, 0, 0, 0, False)
    status = deployment.get("status") or {}
    meta = deployment.get("metadata") or {}
    spec_replicas = (deployment.get("spec") or {}).get("replicas", isvc.desired_replicas)
    return ReplicaCounts(
        desired=spec_replicas,
        replicas=status.get("replicas", 0),
        ready=status.get("readyReplicas", 0),
        updated=status.get("updatedReplicas", 0),
        current=status.get("observedGeneration", -1) >= meta.get("generation", 0),
    )


def unschedulable(isvc: InferenceService, pods: list[dict[str, Any]]) -> Condition | None:
    """Progressing=False when the scheduler cannot place a pod (InsufficientGPU if for GPUs)."""
    for pod in pods:
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if cond.get("type") != "PodScheduled" or cond.get("reason") != "Unschedulable":
                continue
            message = cond.get("message", "")
            name = (pod.get("metadata") or {}).get("name", "?")
            if f"Insufficient {isvc.resources.gpu_resource_name}" in message:
                text = (
                    f"pod {name} needs {isvc.resources.gpu} {isvc.resources.gpu_resource_name} "
                    f"and no node has them free: {message}"
                )
                return Condition(PROGRESSING, False, "InsufficientGPU", text)
            return Condition(PROGRESSING, False, "Unschedulable", f"pod {name}: {message}")
    return None


def crash_looping(pods: list[dict[str, Any]]) -> Condition | None:
    for pod in pods:
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") == "CrashLoopBackOff":
                name = (pod.get("metadata") or {}).get("name", "?")
                detail = waiting.get("message", "the server keeps exiting")
                return Condition(DEGRADED, True, "CrashLoopBackOff", f"pod {name}: {detail}")
    return None


def lws_api_missing(isvc: InferenceService, observed: Observed) -> Condition | None:
    """engine.nodes > 1 on a cluster without the LeaderWorkerSet API: nothing can run."""
    if not isvc.engine.multi_node or observed.lws_served is not False:
        return None
    message = (
        f"engine.nodes {isvc.engine.nodes} runs each replica as a LeaderWorkerSet group, and "
        f"this cluster does not serve {c.LWS_API} leaderworkersets: install LeaderWorkerSet "
        f"({LWS_INSTALL}); the operator creates the group as soon as its CRD is there"
    )
    return Condition(DEGRADED, True, LWS_API_MISSING, message)


def degraded(isvc: InferenceService, observed: Observed) -> Condition:
    if observed.apply_error:
        return Condition(DEGRADED, True, "ApplyFailed", observed.apply_error)
    missing_api = lws_api_missing(isvc, observed) or prefill_invalid(
        isvc, observed.prefill_conflict
    )
    if missing_api is not None:
        return missing_api
    for role, claim in observed.missing_claims:
        message = (
            f"PersistentVolumeClaim {isvc.namespace}/{claim} named by {role} does not exist; "
            "pods cannot start until it does"
        )
        return Condition(DEGRADED, True, "ClaimNotFound", message)
    crash = crash_looping(observed.pods)
    if crash is not None:
        return crash
    return Condition(DEGRADED, False, "AsExpected", "the operator can honour the spec")


def deadline_exceeded(deployment: dict[str, Any] | None) -> Condition | None:
    for cond in ((deployment or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Progressing" and cond.get("reason") == "ProgressDeadlineExceeded":
            return Condition(
                PROGRESSING, False, "ProgressDeadlineExceeded", cond.get("message", "")
            )
    return None


def progressing(isvc: InferenceService, observed: Observed, counts: ReplicaCounts) -> Condition:
    stuck = unschedulable(isvc, observed.pods) or deadline_exceeded(observed.deployment)
    if stuck is not None:
        return stuck
    if observed.deployment is None:
        return Condition(PROGRESSING, True, "Creating", f"creating the {workload_kind(isvc)}")
    if counts.all_ready:
        message = f"{counts.ready}/{counts.desired} replicas run the current spec"
        return Condition(PROGRESSING, False, "RolloutComplete", message)
    message = (
        f"{counts.updated}/{counts.desired} replicas updated, {counts.ready} ready "
        f"(waiting for the model to load and /health to pass)"
    )
    return Condition(PROGRESSING, True, "RollingOut", message)


def ready(
    isvc: InferenceService, counts: ReplicaCounts, progress: Condition, degrade: Condition
) -> Condition:
    if degrade.status:
        return Condition(READY, False, degrade.reason, degrade.message)
    if counts.desired == 0 and isvc.scales_to_zero:
        message = f"idle, no replicas; the first request to {isvc.url} starts one"
        return Condition(READY, True, "ScaledToZero", message)
    if counts.desired == 0:
        return Condition(READY, False, "ScaledToZero", "replicas is 0")
    if counts.all_ready:
        message = f"{counts.ready}/{counts.desired} replicas ready; OpenAI API at {isvc.url}"
        return Condition(READY, True, "Serving", message)
    if not progress.status and progress.reason != "RolloutComplete":
        return Condition(READY, False, progress.reason, progress.message)
    message = f"{counts.ready}/{counts.desired} replicas ready"
    return Condition(READY, False, "ReplicasNotReady", message)


def compute(isvc: InferenceService, observed: Observed) -> tuple[dict[str, Any], list[Condition]]:
    """The status fields (without conditions' timestamps) and the conditions: Ready,
    Progressing, Degraded, AdaptersReady with spec.adapters, RouterReady with spec.router."""
    counts = replica_counts(isvc, observed.deployment)
    degrade = degraded(isvc, observed)
    progress = progressing(isvc, observed, counts)
    fields: dict[str, Any] = {
        "replicas": counts.replicas,
        "readyReplicas": counts.ready,
        "updatedReplicas": counts.updated,
        "selector": selector_string(isvc),
        "url": isvc.url,
        "model": isvc.model.description,
    }
    if observed.applied_generation is not None:
        fields["observedGeneration"] = observed.applied_generation
    conditions = [ready(isvc, counts, progress, degrade), progress, degrade]
    if isvc.adapters is not None:
        conditions.append(adapters_condition(observed.adapters))
    if isvc.router is not None:
        conditions.append(router_condition(isvc, observed.pools_served, observed.picker))
        fields["router"] = router_fields(isvc, observed.picker)
    if isvc.prefill is not None:
        conditions.append(prefill_condition(isvc, observed.prefill, observed.prefill_conflict))
        fields["prefill"] = prefill_fields(isvc, observed.prefill)
    return fields, conditions


def workload_kind(isvc: InferenceService) -> str:
    return c.LWS_KIND if isvc.engine.multi_node else "Deployment"


def deployment_summary(body: Any) -> dict[str, Any]:
    """What a status needs of a Deployment (or LeaderWorkerSet): its identity,
    spec.replicas and status."""
    meta = body.get("metadata") or {}
    identity = ("name", "namespace", "generation", "resourceVersion")
    return copy.deepcopy(
        {
            "kind": body.get("kind"),
            "metadata": {k: meta.get(k) for k in identity},
            "spec": {"replicas": (body.get("spec") or {}).get("replicas")},
            "status": dict(body.get("status") or {}),
        }
    )
