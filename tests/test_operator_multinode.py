"""spec.engine.nodes > 1: one replica is a LeaderWorkerSet group instead of a Deployment's
pod; its leader serves the API behind the Service and pool, its workers run headless."""

from __future__ import annotations

from typing import Any

from octavo_operator.builders.autoscaler import horizontal_pod_autoscaler
from octavo_operator.builders.children import ChildRef, desired_children
from octavo_operator.builders.disruption_budget import pod_disruption_budget
from octavo_operator.builders.inference_pool import inference_pool
from octavo_operator.builders.leader_worker_set import leader_worker_set
from octavo_operator.builders.network_policy import network_policy
from octavo_operator.builders.service import service

from isvc_factories import isvc

# Two hosts, 2 × 2 ranks: two GPUs on each pod (the default resources.gpu).
TWO_NODES = {"engine": {"nodes": 2, "tensorParallelSize": 2, "pipelineParallelSize": 2}}
NODE_KEY = {
    "name": "OCTAVO_NODE_KEY",
    "valueFrom": {"secretKeyRef": {"name": "chat-node-key", "key": "node-key"}},
}
SERVER_PODS = {"app.kubernetes.io/name": "octavo-server", "app.kubernetes.io/instance": "chat"}
LEADERS = {**SERVER_PODS, "app.kubernetes.io/component": "server"}


def group(spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return leader_worker_set(isvc({**TWO_NODES, **(spec or {})}), "octavo:1")


def containers(lws: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    template = lws["spec"]["leaderWorkerTemplate"]
    return (
        template["leaderTemplate"]["spec"]["containers"][0],
        template["workerTemplate"]["spec"]["containers"][0],
    )


def after(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_two_nodes_make_a_leader_worker_set_and_no_deployment() -> None:
    out = desired_children(isvc(TWO_NODES), "img:1", False, leader_worker_sets_served=True)
    kinds = [o["kind"] for o in out.apply]
    assert kinds == ["LeaderWorkerSet", "Service"]
    assert ChildRef("apps/v1", "Deployment", "chat") in out.remove
    assert all(r.kind != "LeaderWorkerSet" for r in out.remove)
    # Its name is not the Service's: LWS makes a headless Service named like the LWS.
    assert out.apply[0]["metadata"]["name"] == "chat-lws"
    assert out.apply[1]["metadata"]["name"] == "chat"


def test_back_to_one_node_removes_the_group_and_its_key() -> None:
    out = desired_children(isvc(), "img:1", False, leader_worker_sets_served=True)
    assert [o["kind"] for o in out.apply] == ["Deployment", "Service"]
    assert ChildRef("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "chat-lws") in out.remove
    assert ChildRef("v1", "Secret", "chat-node-key") in out.remove
    # Without the LWS API there is no group to remove (and no delete of an unknown kind).
    plain = desired_children(isvc(), "img:1", False)
    assert all(r.kind not in ("LeaderWorkerSet", "Secret") for r in plain.remove)


def test_without_the_lws_api_nothing_runs_the_service() -> None:
    out = desired_children(isvc(TWO_NODES), "img:1", False, leader_worker_sets_served=False)
    assert [o["kind"] for o in out.apply] == ["Service"]
    assert ChildRef("apps/v1", "Deployment", "chat") in out.remove


def test_the_group_has_every_defaulted_field_written() -> None:
    """What the LWS CRD and its mutating webhook would fill in, written out: the stored
    object equals the applied one, so the drift check sees no edit."""
    lws = group({"replicas": 3})
    assert (lws["apiVersion"], lws["kind"]) == ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
    spec = lws["spec"]
    assert spec["replicas"] == 3
    assert spec["startupPolicy"] == "LeaderCreated"
    assert spec["networkConfig"] == {"subdomainPolicy": "Shared"}
    assert spec["rolloutStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdateConfiguration": {"partition": 0, "maxUnavailable": 1, "maxSurge": 0},
    }
    template = spec["leaderWorkerTemplate"]
    assert (template["size"], template["restartPolicy"]) == (2, "RecreateGroupOnPodRestart")
    assert lws["metadata"]["ownerReferences"][0]["kind"] == "InferenceService"


def test_recreate_takes_every_group_down_at_once() -> None:
    rollout = group({"rollout": {"strategy": "Recreate"}})["spec"]["rolloutStrategy"]
    assert rollout["rollingUpdateConfiguration"] == {
        "partition": 0,
        "maxUnavailable": "100%",
        "maxSurge": 0,
    }


def test_the_leader_serves_as_node_zero() -> None:
    leader, _ = containers(group())
    args = leader["args"]
    assert args[0] == "serve"
    assert after(args, "--nnodes") == "$(LWS_GROUP_SIZE)"
    assert after(args, "--node-rank") == "0"
    assert after(args, "--master-addr") == "$(LWS_LEADER_ADDRESS)"
    assert after(args, "--master-port") == "29501"
    assert "--headless" not in args
    assert (after(args, "--tensor-parallel-size"), after(args, "--pipeline-parallel-size")) == (
        "2",
        "2",
    )
    assert NODE_KEY in leader["env"]
    assert {"startupProbe", "readinessProbe", "livenessProbe", "lifecycle"} <= set(leader)
    assert leader["ports"][0]["containerPort"] == 8000
    assert leader["resources"]["limits"]["nvidia.com/gpu"] == "2", "4 ranks over 2 nodes"


def test_the_worker_runs_headless_without_probes() -> None:
    leader, worker = containers(
        group({"engine": {**TWO_NODES["engine"], "extraArgs": ["--seed", "7"]}})
    )
    args = worker["args"]
    assert after(args, "--node-rank") == "$(LWS_WORKER_INDEX)"
    assert after(args, "--nnodes") == "$(LWS_GROUP_SIZE)"
    assert after(args, "--master-addr") == "$(LWS_LEADER_ADDRESS)"
    assert "--headless" in args
    assert args[-2:] == ["--seed", "7"], "extraArgs still come last"
    # The same model and layout as the leader: only the node flags differ.
    node_flags = {"--node-rank", "0", "$(LWS_WORKER_INDEX)", "--headless"}
    assert [a for a in args if a not in node_flags] == [
        a for a in leader["args"] if a not in node_flags
    ]
    assert NODE_KEY in worker["env"]
    assert not {"startupProbe", "readinessProbe", "livenessProbe", "ports", "lifecycle"} & set(
        worker
    )
    assert (worker["image"], worker["resources"]) == (leader["image"], leader["resources"])
    assert worker["volumeMounts"] == leader["volumeMounts"]


def test_pod_labels_tell_the_leader_from_its_workers() -> None:
    template = group()["spec"]["leaderWorkerTemplate"]
    leader_labels = template["leaderTemplate"]["metadata"]["labels"]
    worker_labels = template["workerTemplate"]["metadata"]["labels"]
    assert leader_labels.items() >= LEADERS.items()
    assert worker_labels["app.kubernetes.io/component"] == "worker"
    assert worker_labels.items() >= SERVER_PODS.items(), "the service's pods: status, PDB"
    assert "prometheus.io/scrape" in template["leaderTemplate"]["metadata"]["annotations"]
    assert "annotations" not in template["workerTemplate"]["metadata"], "no /metrics"
    worker_pod = template["workerTemplate"]["spec"]
    assert worker_pod["automountServiceAccountToken"] is False
    assert worker_pod["securityContext"]["runAsNonRoot"] is True


def test_only_leaders_are_behind_the_service_and_the_pool() -> None:
    multi = isvc({**TWO_NODES, "router": {"enabled": True}})
    assert service(multi)["spec"]["selector"] == LEADERS
    assert inference_pool(multi)["spec"]["selector"]["matchLabels"] == LEADERS
    single = isvc({"router": {"enabled": True}})  # unchanged for one node: no restart
    assert service(single)["spec"]["selector"] == SERVER_PODS
    assert inference_pool(single)["spec"]["selector"]["matchLabels"] == SERVER_PODS


def test_the_autoscaler_scales_the_inference_service_which_sizes_the_group() -> None:
    """The HPA writes the InferenceService's /scale, as for one node; the operator writes the
    LWS's replicas (groups) from it, clamped to the autoscaling range; idle scale-to-zero
    and the activator patch that same /scale."""
    multi = isvc({**TWO_NODES, "replicas": 9, "autoscaling": {"minReplicas": 0, "maxReplicas": 4}})
    target = horizontal_pod_autoscaler(multi)["spec"]["scaleTargetRef"]
    assert target == {
        "apiVersion": "octavo.dev/v1alpha1",
        "kind": "InferenceService",
        "name": "chat",
    }
    assert leader_worker_set(multi, "octavo:1")["spec"]["replicas"] == 4


def test_a_disruption_budget_counts_whole_groups() -> None:
    """Evicting any pod of a group recreates the group: a replica down is `nodes` pods."""
    budget = pod_disruption_budget(isvc({**TWO_NODES, "disruptionBudget": {"maxUnavailable": 1}}))
    assert budget["spec"]["maxUnavailable"] == 2
    assert budget["spec"]["selector"]["matchLabels"] == SERVER_PODS, "leaders and workers"
    floor = pod_disruption_budget(isvc({**TWO_NODES, "disruptionBudget": {"minAvailable": 3}}))
    assert floor["spec"]["minAvailable"] == 6
    share = pod_disruption_budget(isvc({**TWO_NODES, "disruptionBudget": {"minAvailable": "50%"}}))
    assert share["spec"]["minAvailable"] == "50%"
    single = pod_disruption_budget(isvc({"disruptionBudget": {"maxUnavailable": 1}}))
    assert single["spec"]["maxUnavailable"] == 1


def test_the_network_policy_opens_every_tcp_port_inside_the_group() -> None:
    policy = network_policy(isvc({**TWO_NODES, "networkPolicy": {"enabled": True}}))
    assert policy["spec"]["podSelector"]["matchLabels"] == SERVER_PODS
    group_rule = policy["spec"]["ingress"][-1]
    assert group_rule == {
        "from": [
            {"podSelector": {"matchLabels": {"leaderworkerset.sigs.k8s.io/name": "chat-lws"}}}
        ],
        "ports": [{"protocol": "TCP"}],  # the master port, the next one, gloo/NCCL's own
    }
    single = network_policy(isvc({"networkPolicy": {"enabled": True}}))
    assert len(single["spec"]["ingress"]) == 1


def test_the_api_key_stays_on_the_leader() -> None:
    leader, worker = containers(group({"apiKeySecretRef": {"name": "keys"}}))
    assert "OCTAVO_API_KEY" in {e["name"] for e in leader["env"]}
    assert "OCTAVO_API_KEY" not in {e["name"] for e in worker["env"]}, "a worker serves no API"
    assert NODE_KEY in worker["env"]
