"""Scheduling onto the fake GPU nodes: Deployments become Ready, scale, and over-asks pend."""

from __future__ import annotations

from kubernetes import client

from e2e.cluster import NODE_NAMES, NODE_RESOURCES
from e2e.helpers import deployment, pod, pod_is_ready, wait_for


def _ready_pods(core: client.CoreV1Api, namespace: str, app: str) -> list[client.V1Pod]:
    pods = core.list_namespaced_pod(namespace, label_selector=f"app={app}").items
    return [p for p in pods if p.metadata.deletion_timestamp is None and pod_is_ready(p)]


def _wait_deployment_ready(apps: client.AppsV1Api, namespace: str, name: str, replicas: int):
    def ready() -> client.V1Deployment | None:
        d = apps.read_namespaced_deployment(name, namespace)
        s = d.status
        done = (
            s.observed_generation == d.metadata.generation
            and (s.ready_replicas or 0) == replicas
            and (s.available_replicas or 0) == replicas
            and (s.updated_replicas or 0) == replicas
        )
        return d if done else None

    return wait_for(
        ready,
        timeout=90,
        what=f"deployment {name} to have {replicas} ready replicas",
        describe=lambda: apps.read_namespaced_deployment(name, namespace).status,
    )


def test_nodes_advertise_gpus(core: client.CoreV1Api):
    nodes = {n.metadata.name: n for n in core.list_node(label_selector="type=kwok").items}
    assert set(NODE_NAMES) <= set(nodes)
    for name in NODE_NAMES:
        allocatable = nodes[name].status.allocatable
        assert allocatable["nvidia.com/gpu"] == NODE_RESOURCES["nvidia.com/gpu"] == "8"
        assert allocatable["cpu"] == NODE_RESOURCES["cpu"]
        assert allocatable["memory"] == NODE_RESOURCES["memory"]


def test_gpu_deployment_is_scheduled_ready_and_scales(
    namespace: str, apps: client.AppsV1Api, core: client.CoreV1Api
):
    apps.create_namespaced_deployment(namespace, deployment("llm", replicas=2, gpus=1))
    _wait_deployment_ready(apps, namespace, "llm", 2)

    pods = wait_for(lambda: len(_ready_pods(core, namespace, "llm")) == 2, what="2 ready pods")
    pods = _ready_pods(core, namespace, "llm")
    assert len(pods) == 2
    for p in pods:
        assert p.spec.node_name in NODE_NAMES, p.spec.node_name
        assert p.status.phase == "Running"
        assert p.status.pod_ip, "kwok assigns a (fake) pod IP"
        assert all(cs.ready for cs in p.status.container_statuses)
        assert p.spec.containers[0].resources.requests["nvidia.com/gpu"] == "1"

    apps.patch_namespaced_deployment_scale("llm", namespace, {"spec": {"replicas": 3}})
    _wait_deployment_ready(apps, namespace, "llm", 3)
    wait_for(lambda: len(_ready_pods(core, namespace, "llm")) == 3, what="3 ready pods")
    assert {p.spec.node_name for p in _ready_pods(core, namespace, "llm")} <= set(NODE_NAMES)


def test_pod_asking_for_16_gpus_stays_pending(namespace: str, core: client.CoreV1Api):
    core.create_namespaced_pod(namespace, pod("too-big", gpus=16))

    def failed_scheduling() -> list[client.CoreV1Event]:
        return core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=too-big,reason=FailedScheduling"
        ).items

    events = wait_for(failed_scheduling, timeout=60, what="a FailedScheduling event")
    assert any("Insufficient nvidia.com/gpu" in (e.message or "") for e in events), [
        e.message for e in events
    ]

    def scheduled_condition() -> list[client.V1PodCondition]:
        # The scheduler records the event and the pod condition separately: wait for both.
        p = core.read_namespaced_pod("too-big", namespace)
        return [c for c in p.status.conditions or [] if c.type == "PodScheduled"]

    scheduled = wait_for(scheduled_condition, timeout=30, what="the PodScheduled condition")
    assert scheduled[0].status == "False"
    assert scheduled[0].reason == "Unschedulable"
    p = core.read_namespaced_pod("too-big", namespace)
    assert p.status.phase == "Pending"
    assert not p.spec.node_name
