"""Delete a worker pod of a LeaderWorkerSet group and see the whole group recreated.

kwok completes a pod's deletion at once, so the LWS controller (which reads pods from its
cache) could miss the worker's deletionTimestamp, and only the worker StatefulSet would
replace the worker. So the worker is held with a finalizer of the test's own: it stays
Terminating until the controller has reacted (leader deleted with Foreground propagation,
a RecreateGroup event naming the worker), then the finalizer is removed and the group is
rebuilt: a new leader pod, a new worker StatefulSet, new worker pods.
"""

from __future__ import annotations

from kubernetes import client

from e2e import lws
from e2e.helpers import wait_for

HOLD = "octavo.dev/e2e-hold"


def delete_worker_and_wait_new_group(
    core: client.CoreV1Api, namespace: str, name: str, before: lws.Group, timeout: float = 90
) -> lws.Group:
    """Delete BEFORE's first worker; return the recreated group (every pod a new UID)."""
    worker = before.workers[0].metadata.name
    core.patch_namespaced_pod(worker, namespace, {"metadata": {"finalizers": [HOLD]}})
    try:
        core.delete_namespaced_pod(worker, namespace)
        wait_for(
            lambda: deleting_or_gone(core, namespace, before.leader),
            timeout=30,
            what="the LWS controller to delete the group's leader",
        )
        # The controller's event recorder posts in the background, after the delete.
        wait_for(
            lambda: recreate_event_names(core, namespace, worker),
            timeout=30,
            what=f"a RecreateGroup event naming {worker}",
        )
    finally:
        release(core, namespace, worker)
    return lws.wait_group_ready(core, namespace, name, exclude=before.uids, timeout=timeout)


def recreate_event_names(core: client.CoreV1Api, namespace: str, worker: str) -> bool:
    events = core.list_namespaced_event(namespace, field_selector="reason=RecreateGroup")
    return any(worker in (e.message or "") for e in events.items)


def deleting_or_gone(core: client.CoreV1Api, namespace: str, pod: client.V1Pod) -> bool:
    try:
        now = core.read_namespaced_pod(pod.metadata.name, namespace)
    except client.ApiException as error:
        if error.status == 404:
            return True
        raise
    return now.metadata.uid != pod.metadata.uid or now.metadata.deletion_timestamp is not None


def release(core: client.CoreV1Api, namespace: str, name: str) -> None:
    """Drop the test's finalizer (and only it) from pod NAME: a JSON patch (finalizers merge
    under a strategic merge patch), retried while another writer changed them."""

    def released() -> bool:
        try:
            held = core.read_namespaced_pod(name, namespace).metadata.finalizers or []
            if HOLD not in held:
                return True
            rest = [f for f in held if f != HOLD]
            patch = [
                {"op": "test", "path": "/metadata/finalizers", "value": held},
                {"op": "replace", "path": "/metadata/finalizers", "value": rest},
            ]
            core.patch_namespaced_pod(name, namespace, patch)
        except client.ApiException as error:
            if error.status == 404:
                return True
            if error.status not in (409, 422):  # 422: the test op saw other finalizers
                raise
        return False

    wait_for(released, timeout=30, what=f"{HOLD} removed from {name}")
