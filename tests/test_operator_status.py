"""Status and conditions computed from the Deployment, its pods and missing claims."""

from __future__ import annotations

from octavo_operator.conditions import Condition, merge, transitions
from octavo_operator.status import Observed, compute

from isvc_factories import isvc


def deployment(replicas=1, ready=1, updated=1, generation=2, observed=2, conditions=()):
    return {
        "metadata": {"generation": generation, "resourceVersion": "10"},
        "spec": {"replicas": replicas},
        "status": {
            "replicas": replicas,
            "readyReplicas": ready,
            "updatedReplicas": updated,
            "observedGeneration": observed,
            "conditions": list(conditions),
        },
    }


def unschedulable_pod(message: str) -> dict:
    cond = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": message,
    }
    return {"metadata": {"name": "chat-abc"}, "status": {"phase": "Pending", "conditions": [cond]}}


def conditions(spec=None, **observed) -> dict[str, Condition]:
    _, conds = compute(isvc(spec), Observed(applied_generation=3, **observed))
    return {c.type: c for c in conds}


def test_all_ready_is_ready_with_url():
    fields, conds = compute(isvc(), Observed(applied_generation=3, deployment=deployment()))
    assert fields == {
        "replicas": 1,
        "readyReplicas": 1,
        "updatedReplicas": 1,
        "selector": "app.kubernetes.io/name=octavo-server,app.kubernetes.io/instance=chat",
        "url": "http://chat.team-a.svc.cluster.local:8000/v1",
        "model": "embedded:SmolLM2-135M-Instruct",
        "observedGeneration": 3,
    }
    ready, progressing, degraded = conds
    assert (ready.type, ready.status, ready.reason) == ("Ready", True, "Serving")
    assert "http://chat.team-a.svc.cluster.local:8000/v1" in ready.message
    assert (progressing.status, progressing.reason) == (False, "RolloutComplete")
    assert (degraded.status, degraded.reason) == (False, "AsExpected")


def test_rolling_out_until_pods_are_ready():
    c = conditions(deployment=deployment(replicas=2, ready=1, updated=1))
    assert (c["Ready"].status, c["Ready"].reason) == (False, "ReplicasNotReady")
    assert (c["Progressing"].status, c["Progressing"].reason) == (True, "RollingOut")
    assert "1/2" in c["Ready"].message


def test_stale_deployment_status_is_not_trusted():
    c = conditions(deployment=deployment(generation=3, observed=2))
    assert c["Ready"].status is False and c["Progressing"].reason == "RollingOut"


def test_no_deployment_yet():
    c = conditions()
    assert (c["Progressing"].status, c["Progressing"].reason) == (True, "Creating")
    assert c["Ready"].status is False


def test_insufficient_gpu():
    pod = unschedulable_pod("0/2 nodes are available: 2 Insufficient nvidia.com/gpu.")
    c = conditions(
        {"resources": {"gpu": 16}}, deployment=deployment(ready=0, updated=1), pods=[pod]
    )
    assert (c["Progressing"].status, c["Progressing"].reason) == (False, "InsufficientGPU")
    assert (
        "16 nvidia.com/gpu" in c["Progressing"].message and "chat-abc" in c["Progressing"].message
    )
    assert (c["Ready"].status, c["Ready"].reason) == (False, "InsufficientGPU")
    assert c["Degraded"].status is False


def test_other_unschedulable_reasons():
    pod = unschedulable_pod("0/2 nodes are available: 2 node(s) didn't match node selector.")
    c = conditions(deployment=deployment(ready=0), pods=[pod])
    assert (c["Progressing"].status, c["Progressing"].reason) == (False, "Unschedulable")


def test_missing_claim_is_degraded_not_a_crash():
    c = conditions(
        {"model": {"uri": "pvc://weights/llama"}},
        deployment=deployment(ready=0),
        missing_claims=[("model.uri", "weights")],
    )
    assert (c["Degraded"].status, c["Degraded"].reason) == (True, "ClaimNotFound")
    assert "team-a/weights" in c["Degraded"].message and "model.uri" in c["Degraded"].message
    assert (c["Ready"].status, c["Ready"].reason) == (False, "ClaimNotFound")


def test_apply_error_and_crash_loop_are_degraded():
    c = conditions(apply_error="422: Deployment.apps is invalid")
    assert (c["Degraded"].status, c["Degraded"].reason) == (True, "ApplyFailed")
    crash = {
        "metadata": {"name": "chat-x"},
        "status": {"containerStatuses": [{"state": {"waiting": {"reason": "CrashLoopBackOff"}}}]},
    }
    c = conditions(deployment=deployment(ready=0), pods=[crash])
    assert (c["Degraded"].status, c["Degraded"].reason) == (True, "CrashLoopBackOff")


def test_scaled_to_zero_and_deadline():
    c = conditions({"replicas": 0}, deployment=deployment(replicas=0, ready=0, updated=0))
    assert (c["Ready"].status, c["Ready"].reason) == (False, "ScaledToZero")
    stuck = {
        "type": "Progressing",
        "status": "False",
        "reason": "ProgressDeadlineExceeded",
        "message": "m",
    }
    c = conditions(deployment=deployment(ready=0, conditions=[stuck]))
    assert (c["Progressing"].status, c["Progressing"].reason) == (False, "ProgressDeadlineExceeded")


def test_transition_time_moves_only_on_status_change_and_events_on_reason_change():
    first = [Condition("Ready", False, "ReplicasNotReady", "0/1")]
    old = merge([], first, 1, "2026-01-01T00:00:00Z")
    same_status = [Condition("Ready", False, "InsufficientGPU", "no gpu")]
    kept = merge(old, same_status, 1, "2026-01-01T00:05:00Z")
    assert kept[0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert transitions(old, same_status) == same_status  # reason changed: an Event
    flipped = [Condition("Ready", True, "Serving", "1/1")]
    moved = merge(kept, flipped, 2, "2026-01-01T00:09:00Z")
    assert moved[0]["lastTransitionTime"] == "2026-01-01T00:09:00Z"
    assert moved[0]["observedGeneration"] == 2
    assert transitions(moved, flipped) == []


def test_first_observation_is_an_event_only_when_degraded_or_serving():
    starting = [
        Condition("Ready", False, "ReplicasNotReady", "0/1"),
        Condition("Degraded", False, "AsExpected", ""),
    ]
    assert transitions([], starting) == []
    broken = [Condition("Degraded", True, "ClaimNotFound", "no claim")]
    assert transitions([], broken) == broken
    # Ready before the first status write (a busy operator, pods quick to start): the
    # Serving Event is still posted, once; a status already on the object posts nothing
    serving = [Condition("Ready", True, "Serving", "2/2"), starting[1]]
    assert transitions([], serving) == serving[:1]
    assert transitions(merge([], serving, 1, "2026-01-01T00:00:00Z"), serving) == []


def test_a_first_status_that_cannot_be_scheduled_is_an_event():
    """Seen first (the pod was unschedulable before the first status write, as on a busy
    operator), InsufficientGPU still gets its Warning: no later transition would post it."""
    for reason in ("InsufficientGPU", "Unschedulable"):
        stuck = [Condition("Progressing", False, reason, "no node can take the pod")]
        assert transitions([], stuck) == stuck
