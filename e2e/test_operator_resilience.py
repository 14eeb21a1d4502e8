"""Drift correction, restarts, GPU shortage and claims that do not exist."""

from __future__ import annotations

from kubernetes import client

from e2e import isvc
from e2e.helpers import wait_for


def test_deleted_child_is_recreated_and_edited_child_reverted(
    operator, namespace, custom, apps, core
):
    isvc.create(custom, namespace, isvc.manifest("drift", {"replicas": 1}))
    isvc.wait_condition(custom, namespace, "drift", "Ready", "True")
    old_uid = core.read_namespaced_service("drift", namespace).metadata.uid
    core.delete_namespaced_service("drift", namespace)

    def recreated() -> bool:
        try:
            return core.read_namespaced_service("drift", namespace).metadata.uid != old_uid
        except client.ApiException as error:
            if error.status == 404:
                return False
            raise

    wait_for(recreated, timeout=10, interval=0.2, what="the deleted Service to come back")

    apps.patch_namespaced_deployment("drift", namespace, {"spec": {"replicas": 4}})
    patch = {
        "spec": {"template": {"spec": {"containers": [{"name": "server", "image": "evil:1"}]}}}
    }
    apps.patch_namespaced_deployment("drift", namespace, patch)

    def reverted() -> bool:
        dep = apps.read_namespaced_deployment("drift", namespace)
        image = dep.spec.template.spec.containers[0].image
        return dep.spec.replicas == 1 and image == isvc.FAKE_IMAGE

    wait_for(reverted, timeout=10, interval=0.2, what="the hand-edited Deployment to be put back")
    assert 'octavo_operator_drift_corrections_total{kind="Service"}' in operator.metrics()


def test_restart_keeps_children_unique_and_status_right(operator, namespace, custom, apps, core):
    isvc.create(custom, namespace, isvc.manifest("steady", {"replicas": 2}))
    before = isvc.wait_condition(custom, namespace, "steady", "Ready", "True")
    operator.stop()
    isvc.patch(custom, namespace, "steady", {"spec": {"replicas": 1}})  # while it is down
    operator.start()
    selector = "app.kubernetes.io/instance=steady"
    wait_for(
        lambda: apps.read_namespaced_deployment("steady", namespace).spec.replicas == 1,
        timeout=30,
        what="the restarted operator to apply the change made while it was down",
    )

    def settled() -> dict | None:
        """Ready, one ready replica, and the new generation observed: the scaled-down pod
        may still be terminating when the Deployment already says 1 (kwok deletes it)."""
        obj = isvc.get(custom, namespace, "steady")
        status = obj.get("status") or {}
        done = (
            status.get("readyReplicas") == 1
            and status.get("observedGeneration") == obj["metadata"]["generation"]
            and isvc.condition(obj, "Ready").get("status") == "True"
        )
        return obj if done else None

    after = wait_for(settled, timeout=30, what="the status to settle at 1 ready replica")
    assert len(apps.list_namespaced_deployment(namespace, label_selector=selector).items) == 1
    assert len(core.list_namespaced_service(namespace, label_selector=selector).items) == 1
    ready_before = isvc.condition(before, "Ready")["lastTransitionTime"]
    assert isvc.condition(after, "Ready")["lastTransitionTime"] >= ready_before


def test_gpu_shortage_is_reported_as_insufficient_gpu(operator, namespace, custom, core):
    # The fake nodes have 8 GPUs each: 16 on one pod can never be scheduled.
    spec = {"replicas": 1, "resources": {"gpu": 16}, "engine": {"tensorParallelSize": 16}}
    isvc.create(custom, namespace, isvc.manifest("huge", spec))
    obj = isvc.wait_condition(custom, namespace, "huge", "Progressing", "False", "InsufficientGPU")
    cond = isvc.condition(obj, "Progressing")
    assert "16 nvidia.com/gpu" in cond["message"]
    assert isvc.condition(obj, "Ready")["status"] == "False"
    assert isvc.condition(obj, "Ready")["reason"] == "InsufficientGPU"

    def warned() -> list:
        events = isvc.events_for(core, namespace, "huge")
        return [e for e in events if e.reason == "InsufficientGPU" and e.type == "Warning"]

    # kopf posts Events from one queue, which may first retry an earlier test's Event into
    # its terminating namespace for about a minute.
    event = wait_for(warned, timeout=90, what="an InsufficientGPU Event")[0]
    assert "nvidia.com/gpu" in event.message


def test_missing_model_claim_is_degraded_until_it_exists(operator, namespace, custom, core):
    isvc.create(
        custom, namespace, isvc.manifest("claimed", {"model": {"uri": "pvc://weights/llama"}})
    )
    obj = isvc.wait_condition(custom, namespace, "claimed", "Degraded", "True", "ClaimNotFound")
    assert f"{namespace}/weights" in isvc.condition(obj, "Degraded")["message"]
    claim = {
        "metadata": {"name": "weights"},
        "spec": {"accessModes": ["ReadOnlyMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    core.create_namespaced_persistent_volume_claim(namespace, claim)
    isvc.wait_condition(custom, namespace, "claimed", "Degraded", "False", "AsExpected")

    def claim_events() -> list[str]:
        reasons = [e.reason for e in isvc.events_for(core, namespace, "claimed")]
        return reasons if "ClaimNotFound" in reasons else []

    # One event queue (see above): the Event may land after the condition.
    reasons = wait_for(claim_events, timeout=90, what="the ClaimNotFound Event")
    # One status write per change, not a retry storm: few events for this object.
    assert len(reasons) < 10, reasons
