"""The garbage collector removes a deleted Deployment's ReplicaSet and pods."""

from __future__ import annotations

from kubernetes import client

from e2e.helpers import deployment, pod_is_ready, wait_for


def test_deleting_deployment_removes_replicaset_and_pods(
    namespace: str, apps: client.AppsV1Api, core: client.CoreV1Api
):
    apps.create_namespaced_deployment(namespace, deployment("gc", replicas=2, gpus=1))

    def ready_pods() -> list[client.V1Pod]:
        pods = core.list_namespaced_pod(namespace, label_selector="app=gc").items
        return [p for p in pods if pod_is_ready(p)] if len(pods) == 2 else []

    pods = wait_for(lambda: len(ready_pods()) == 2 and ready_pods(), timeout=90, what="2 pods")
    uid = apps.read_namespaced_deployment("gc", namespace).metadata.uid
    replicasets = apps.list_namespaced_replica_set(namespace, label_selector="app=gc").items
    assert len(replicasets) == 1
    rs = replicasets[0]
    assert [o.uid for o in rs.metadata.owner_references] == [uid]
    assert all(p.metadata.owner_references[0].uid == rs.metadata.uid for p in pods)

    apps.delete_namespaced_deployment("gc", namespace, propagation_policy="Background")

    def all_gone() -> bool:
        rs_left = apps.list_namespaced_replica_set(namespace, label_selector="app=gc").items
        pods_left = core.list_namespaced_pod(namespace, label_selector="app=gc").items
        return not rs_left and not pods_left

    wait_for(
        all_gone,
        timeout=90,
        what="the garbage collector to delete the ReplicaSet and its pods",
        describe=lambda: (
            [r.metadata.name for r in apps.list_namespaced_replica_set(namespace).items],
            [p.metadata.name for p in core.list_namespaced_pod(namespace).items],
        ),
    )
