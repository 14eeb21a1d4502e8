"""LeaderWorkerSet helpers for the e2e tests: build one, read a group's pods, wait for them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubernetes import client

from e2e.helpers import FAKE_IMAGE, pod_is_ready, wait_for

GROUP, VERSION, PLURAL = "leaderworkerset.x-k8s.io", "v1", "leaderworkersets"
LABEL = "leaderworkerset.sigs.k8s.io"  # prefix of every label/annotation LWS sets
NAME_LABEL = f"{LABEL}/name"
WORKER_INDEX_LABEL = f"{LABEL}/worker-index"
GROUP_INDEX_LABEL = f"{LABEL}/group-index"
LWS_ENV = ("LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX")


def manifest(name: str, size: int, replicas: int = 1) -> dict[str, Any]:
    """An LWS of REPLICAS groups of SIZE pods, one container whose args name the LWS env."""
    container = {
        "name": "main",
        "image": FAKE_IMAGE,
        "command": ["serve"],
        "args": ["--leader", "$(LWS_LEADER_ADDRESS)", "--rank", "$(LWS_WORKER_INDEX)"],
    }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "leaderWorkerTemplate": {
                "size": size,
                "workerTemplate": {"spec": {"containers": [container]}},
            },
        },
    }


def create(custom: client.CustomObjectsApi, namespace: str, body: dict[str, Any]) -> dict:
    return custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)


def get(custom: client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any]:
    return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


@dataclass(frozen=True)
class Group:
    """One group's pods, as the apiserver has them: the leader and its workers by index."""

    leader: client.V1Pod
    workers: tuple[client.V1Pod, ...]

    @property
    def pods(self) -> tuple[client.V1Pod, ...]:
        return (self.leader, *self.workers)

    @property
    def uids(self) -> frozenset[str]:
        return frozenset(p.metadata.uid for p in self.pods)


def group_pods(core: client.CoreV1Api, namespace: str, name: str, index: int = 0) -> Group | None:
    """Group INDEX of LWS NAME (pods not being deleted), or None while it is incomplete."""
    selector = f"{NAME_LABEL}={name},{GROUP_INDEX_LABEL}={index}"
    pods = [
        p
        for p in core.list_namespaced_pod(namespace, label_selector=selector).items
        if not p.metadata.deletion_timestamp
    ]
    by_index = {int(p.metadata.labels[WORKER_INDEX_LABEL]): p for p in pods}
    size = int(pods[0].metadata.annotations[f"{LABEL}/size"]) if pods else 0
    if not pods or sorted(by_index) != list(range(size)):
        return None
    return Group(by_index[0], tuple(by_index[i] for i in range(1, size)))


def wait_group_ready(
    core: client.CoreV1Api,
    namespace: str,
    name: str,
    *,
    exclude: frozenset[str] = frozenset(),
    timeout: float = 60,
) -> Group:
    """The group's pods, all Ready (by kwok) and none of them with a UID in EXCLUDE."""

    def ready() -> Group | None:
        group = group_pods(core, namespace, name)
        if group is None or group.uids & exclude:
            return None
        return group if all(pod_is_ready(p) for p in group.pods) else None

    def describe() -> list[tuple[str, str | None, Any]]:
        pods = core.list_namespaced_pod(namespace, label_selector=f"{NAME_LABEL}={name}").items
        return [(p.metadata.name, p.status.phase, p.metadata.deletion_timestamp) for p in pods]

    return wait_for(ready, timeout=timeout, what=f"LWS {name}'s group Ready", describe=describe)


def env_of(pod: client.V1Pod, container: int = 0) -> dict[str, str | None]:
    """The container's literal env values (valueFrom entries map to None)."""
    return {e.name: e.value for e in pod.spec.containers[container].env or []}


def ready_replicas(custom: client.CustomObjectsApi, namespace: str, name: str) -> int:
    return (get(custom, namespace, name).get("status") or {}).get("readyReplicas") or 0
