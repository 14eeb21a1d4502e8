"""The operator on the real control plane: apply -> children -> Ready; changes roll the
Deployment; /scale scales it; delete removes everything. The operator runs as its
ServiceAccount (see e2e/operator_process.py), so these also prove its RBAC suffices."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from e2e import isvc
from e2e.helpers import persistent_volume_for, wait_for

CHILD_DEADLINE_SECONDS = 2.0


def read_or_none(read, *args):
    try:
        return read(*args)
    except client.ApiException as error:
        if error.status == 404:
            return None
        raise


@pytest.fixture
def volume(core: client.CoreV1Api, namespace: str):
    """A PersistentVolume for the cache claim: the test cluster has no provisioner."""
    with persistent_volume_for(core, namespace, "chat-cache", "20Gi") as name:
        yield name


def test_apply_creates_children_and_reports_ready(
    operator, namespace, volume, custom, apps, core, api_client, kubectl
):
    policy, autoscaling = client.PolicyV1Api(api_client), client.AutoscalingV2Api(api_client)
    spec = {
        "autoscaling": {
            "minReplicas": 2,
            "maxReplicas": 4,
            "metric": "requestsWaiting",
            "target": 5,
        },
        "disruptionBudget": {"maxUnavailable": 1},
        "cache": {"size": "20Gi"},
    }
    started = time.monotonic()
    isvc.create(custom, namespace, isvc.manifest("chat", spec))
    children = {
        "Deployment": lambda: read_or_none(apps.read_namespaced_deployment, "chat", namespace),
        "Service": lambda: read_or_none(core.read_namespaced_service, "chat", namespace),
        "PodDisruptionBudget": lambda: read_or_none(
            policy.read_namespaced_pod_disruption_budget, "chat", namespace
        ),
        "HorizontalPodAutoscaler": lambda: read_or_none(
            autoscaling.read_namespaced_horizontal_pod_autoscaler, "chat", namespace
        ),
        "PersistentVolumeClaim": lambda: read_or_none(
            core.read_namespaced_persistent_volume_claim, "chat-cache", namespace
        ),
    }
    seen = wait_for(
        lambda: all(read() for read in children.values()),
        timeout=10,
        interval=0.05,
        what="every child",
    )
    elapsed = time.monotonic() - started
    assert seen and elapsed < CHILD_DEADLINE_SECONDS, f"children took {elapsed:.2f} s"

    hpa = children["HorizontalPodAutoscaler"]()
    assert hpa.spec.scale_target_ref.kind == "InferenceService"
    assert hpa.spec.scale_target_ref.name == "chat"
    dep = children["Deployment"]()
    assert dep.metadata.owner_references[0].kind == "InferenceService"
    assert dep.spec.replicas == 2  # spec.replicas defaults to 1: clamped up to minReplicas

    obj = isvc.wait_condition(custom, namespace, "chat", "Ready", "True", "Serving")
    status = obj["status"]
    assert status["url"] == f"http://chat.{namespace}.svc.cluster.local:8000/v1"
    assert status["readyReplicas"] == 2 and status["replicas"] == 2
    assert status["observedGeneration"] == obj["metadata"]["generation"]
    assert obj["spec"]["replicas"] in (1, 2), "the CRD's default, or the HPA's /scale write"
    assert isvc.condition(obj, "Degraded")["status"] == "False"

    table = kubectl("get", "isvc", "chat", "-n", namespace).stdout.splitlines()
    assert table[0].split()[:5] == ["NAME", "READY", "REPLICAS", "MODEL", "URL"]
    row = table[1].split()
    assert row[:4] == ["chat", "True", "2", "embedded:SmolLM2-135M-Instruct"]
    assert row[4] == status["url"]
    # Posted after the status patch, in the background (kopf's event poster). Also when the
    # first status written already says Ready: on a busy operator the pods can be ready
    # before the first write, and that write is the only transition there is.
    wait_for(
        lambda: "Serving" in {e.reason for e in isvc.events_for(core, namespace, "chat")},
        timeout=90,
        what="the Serving event",
    )


def container_args(apps, namespace: str, name: str) -> list[str]:
    return apps.read_namespaced_deployment(name, namespace).spec.template.spec.containers[0].args


def test_spec_change_rolls_out_and_scale_subresource_scales(
    operator, namespace, custom, apps, kubectl
):
    isvc.create(custom, namespace, isvc.manifest("roll", {"replicas": 1}))
    isvc.wait_condition(custom, namespace, "roll", "Ready", "True")
    first_generation = apps.read_namespaced_deployment("roll", namespace).metadata.generation

    isvc.patch(
        custom,
        namespace,
        "roll",
        {"spec": {"engine": {"maxNumSeqs": 32}, "image": "registry.invalid/octavo/server:e2e-2"}},
    )
    wait_for(
        lambda: "--max-num-seqs" in container_args(apps, namespace, "roll"),
        timeout=10,
        what="the new engine args in the Deployment",
    )
    dep = apps.read_namespaced_deployment("roll", namespace)
    args = dep.spec.template.spec.containers[0].args
    assert args[args.index("--max-num-seqs") + 1] == "32"
    assert dep.spec.template.spec.containers[0].image.endswith(":e2e-2")
    assert dep.metadata.generation > first_generation
    # A rolling update: a new ReplicaSet takes over and the CR is Ready on the new spec.
    obj = isvc.wait_condition(custom, namespace, "roll", "Ready", "True", timeout=60)
    assert obj["status"]["updatedReplicas"] == 1
    # The Deployment controller settles its ReplicaSets' sizes a moment later when its cache
    # lags (seen once under load: both at 0 right after Ready): wait for the final split.
    selector = "app.kubernetes.io/instance=roll"

    def replica_split() -> list[int]:
        sets = apps.list_namespaced_replica_set(namespace, label_selector=selector).items
        return sorted(rs.spec.replicas for rs in sets)

    wait_for(
        lambda: replica_split() == [0, 1], timeout=60, what="the old ReplicaSet at 0, the new at 1"
    )

    kubectl("scale", "isvc", "roll", "-n", namespace, "--replicas=3")
    wait_for(
        lambda: apps.read_namespaced_deployment("roll", namespace).spec.replicas == 3,
        timeout=10,
        what="the Deployment to follow /scale",
    )
    scale = custom.get_namespaced_custom_object_scale(
        isvc.GROUP, isvc.VERSION, namespace, isvc.PLURAL, "roll"
    )
    assert scale["spec"]["replicas"] == 3
    # The Ready condition is already True from one replica: wait for the status to count
    # three (a loaded controller reports the new pods a few seconds later).
    wait_for(
        lambda: isvc.get(custom, namespace, "roll")["status"].get("readyReplicas") == 3,
        timeout=60,
        what="three ready replicas in the status",
    )
    obj = isvc.wait_condition(custom, namespace, "roll", "Ready", "True", timeout=60)
    assert obj["status"]["readyReplicas"] == 3
    scale = custom.get_namespaced_custom_object_scale(
        isvc.GROUP, isvc.VERSION, namespace, isvc.PLURAL, "roll"
    )
    assert scale["status"]["replicas"] == 3
    assert (
        scale["status"]["selector"]
        == "app.kubernetes.io/name=octavo-server,app.kubernetes.io/instance=roll"
    )


def test_delete_removes_every_child(operator, namespace, volume, custom, apps, core, api_client):
    spec = {"replicas": 1, "disruptionBudget": {"minAvailable": 1}, "cache": {"size": "1Gi"}}
    isvc.create(custom, namespace, isvc.manifest("chat", spec))
    isvc.wait_condition(custom, namespace, "chat", "Ready", "True")
    custom.delete_namespaced_custom_object(isvc.GROUP, isvc.VERSION, namespace, isvc.PLURAL, "chat")
    policy = client.PolicyV1Api(api_client)

    def nothing_left() -> bool:
        selector = "app.kubernetes.io/instance=chat"
        return not any(
            [
                apps.list_namespaced_deployment(namespace, label_selector=selector).items,
                core.list_namespaced_service(namespace, label_selector=selector).items,
                core.list_namespaced_pod(namespace, label_selector=selector).items,
                core.list_namespaced_persistent_volume_claim(
                    namespace, label_selector=selector
                ).items,
                policy.list_namespaced_pod_disruption_budget(
                    namespace, label_selector=selector
                ).items,
            ]
        )

    wait_for(nothing_left, timeout=60, what="garbage collection of every child")
