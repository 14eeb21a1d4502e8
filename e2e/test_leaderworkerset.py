"""The LeaderWorkerSet controller (built from the Go module proxy, e2e/lws_controller.py) on
the real control plane: its webhooks are reachable by the apiserver and it makes groups.

- A raw LWS of size 2 becomes a leader pod (leader StatefulSet) and a worker StatefulSet owned
  by the leader pod, with the pod webhook's LWS_LEADER_ADDRESS / LWS_GROUP_SIZE /
  LWS_WORKER_INDEX in every container, the headless Service, and readyReplicas 1.
- Deleting a worker pod recreates the whole group (restartPolicy RecreateGroupOnPodRestart;
  the worker is held by a finalizer until the controller reacted: see e2e/lws_recreate.py).
"""

from __future__ import annotations

import subprocess

import yaml

from e2e import lws
from e2e.cluster import build, versions
from e2e.helpers import wait_for
from e2e.lws_controller import binaries
from e2e.lws_recreate import delete_worker_and_wait_new_group


def test_the_lws_controller_is_the_pinned_release_with_both_crds():
    binary, crds = binaries()
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    assert versions.LWS in out.stdout + out.stderr
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # 1.3-1.5 MB each
    kinds = {yaml.load(p.read_text(), Loader=loader)["spec"]["names"]["kind"] for p in crds}
    assert kinds == {"LeaderWorkerSet", "DisaggregatedSet"}
    assert [path.name for path in crds] == list(build.LWS_CRDS)


def test_lws_of_size_two_makes_a_leader_and_a_worker_statefulset_with_lws_env(
    lws_controller, namespace, core, apps, custom
):
    made = lws.create(custom, namespace, lws.manifest("demo", size=2))
    rolling = made["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]
    assert rolling["partition"] == 0  # the mutating LWS webhook's defaults
    group = lws.wait_group_ready(core, namespace, "demo")

    assert group.leader.metadata.name == "demo-0"
    assert [w.metadata.name for w in group.workers] == ["demo-0-1"]
    for index, pod in enumerate(group.pods):
        env = lws.env_of(pod)
        assert env["LWS_LEADER_ADDRESS"] == f"demo-0.demo.{namespace}"
        assert env["LWS_GROUP_SIZE"] == "2"
        assert env["LWS_WORKER_INDEX"] == str(index)
        assert pod.metadata.labels[lws.WORKER_INDEX_LABEL] == str(index)

    leaders = apps.read_namespaced_stateful_set("demo", namespace)
    assert leaders.spec.replicas == 1
    workers = apps.read_namespaced_stateful_set("demo-0", namespace)
    assert workers.spec.replicas == 1
    (owner,) = workers.metadata.owner_references
    assert (owner.kind, owner.uid) == ("Pod", group.leader.metadata.uid)
    service = core.read_namespaced_service("demo", namespace)
    assert service.spec.cluster_ip == "None"
    wait_for(lambda: lws.ready_replicas(custom, namespace, "demo") == 1, what="readyReplicas 1")


def test_deleting_a_worker_pod_recreates_the_whole_group(lws_controller, namespace, core, custom):
    lws.create(custom, namespace, lws.manifest("grp", size=3))
    before = lws.wait_group_ready(core, namespace, "grp")
    after = delete_worker_and_wait_new_group(core, namespace, "grp", before)
    assert [p.metadata.name for p in after.pods] == [p.metadata.name for p in before.pods]
    wait_for(lambda: lws.ready_replicas(custom, namespace, "grp") == 1, what="readyReplicas 1")
